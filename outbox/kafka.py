"""Kafka and Azure Event Hubs (its Kafka endpoint): the transport, its options and the consumer.

Needs the ``kafka`` extra (confluent-kafka); importing this module does not load it (docs/kafka.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.consumer import BatchReport, KafkaConsumer, KafkaConsumerOptions
    from dispatcher.kafka.transport import KafkaTransport

_EXPORTS = {
    "KafkaConsumer": "dispatcher.kafka.consumer",
    "KafkaConsumerOptions": "dispatcher.kafka.consumer",
    "BatchReport": "dispatcher.kafka.consumer",
    "KafkaTransport": "dispatcher.kafka.transport",
    "KafkaConfig": "dispatcher.kafka.config",
}

__all__ = [
    "BatchReport",
    "KafkaConfig",
    "KafkaConsumer",
    "KafkaConsumerOptions",
    "KafkaTransport",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)

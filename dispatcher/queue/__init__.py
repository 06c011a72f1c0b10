"""The durable SQL queue (Service Bus semantics on SQLite or PostgreSQL), its consumer, and its
ports: ``QueueSender``, ``QueueReceiver`` and ``QueueAdministration`` (``typing.Protocol``s).

The names below are resolved on first use (PEP 562), as in ``outbox``: importing a light module
of this package (``validation``, ``messages``, ``ports``) does not load the queue, its consumer
and SQLAlchemy's dialects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatcher.queue.consumer import Consumer
    from dispatcher.queue.consumer_options import ConsumerOptions
    from dispatcher.queue.messages import (
        DeadLetter,
        DeferMessage,
        PeekedMessage,
        QueueMessage,
        QueueStats,
        ReceivedMessage,
    )
    from dispatcher.queue.ports import (
        DeferringReceiver,
        QueueAdministration,
        QueueReceiver,
        QueueSender,
    )
    from dispatcher.queue.sql_queue import MAX_DELIVERY_REASON, SqlQueue
    from outbox.core.backoff import ExponentialBackoff
    from outbox.core.errors import UnprocessableMessageError

_EXPORTS = {
    "Consumer": "dispatcher.queue.consumer",
    "ConsumerOptions": "dispatcher.queue.consumer_options",
    "DeadLetter": "dispatcher.queue.messages",
    "DeferMessage": "dispatcher.queue.messages",
    "DeferringReceiver": "dispatcher.queue.ports",
    "PeekedMessage": "dispatcher.queue.messages",
    "QueueMessage": "dispatcher.queue.messages",
    "QueueStats": "dispatcher.queue.messages",
    "ReceivedMessage": "dispatcher.queue.messages",
    "QueueAdministration": "dispatcher.queue.ports",
    "QueueReceiver": "dispatcher.queue.ports",
    "QueueSender": "dispatcher.queue.ports",
    "MAX_DELIVERY_REASON": "dispatcher.queue.sql_queue",
    "SqlQueue": "dispatcher.queue.sql_queue",
    "ExponentialBackoff": "outbox.core.backoff",
    "UnprocessableMessageError": "outbox.core.errors",
}

__all__ = [
    "MAX_DELIVERY_REASON",
    "Consumer",
    "ConsumerOptions",
    "DeadLetter",
    "DeferMessage",
    "DeferringReceiver",
    "ExponentialBackoff",
    "PeekedMessage",
    "QueueAdministration",
    "QueueMessage",
    "QueueReceiver",
    "QueueSender",
    "QueueStats",
    "ReceivedMessage",
    "SqlQueue",
    "UnprocessableMessageError",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Where outbox messages go: the ``Transport`` port and the adapters a user builds by hand.

``Outbox.open(transport=...)`` takes a name (settings) or one of these objects. Kafka's lives in
``outbox.kafka``; ``ServiceBusTransport`` needs the ``azure`` extra. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from dispatcher.claims.sql import SqlClaimLog
    from dispatcher.servicebus.transport import ServiceBusTransport
    from dispatcher.transports.base import Transport, TransportMessage
    from dispatcher.transports.geo import GeoReplicatedTransport
    from dispatcher.transports.memory import InMemoryTransport
    from dispatcher.transports.sql import SqlQueueTransport

_EXPORTS = {
    "Transport": "dispatcher.transports.base",
    "TransportMessage": "dispatcher.transports.base",
    "InMemoryTransport": "dispatcher.transports.memory",
    "SqlQueueTransport": "dispatcher.transports.sql",
    "GeoReplicatedTransport": "dispatcher.transports.geo",
    "SqlClaimLog": "dispatcher.claims.sql",
    "ServiceBusTransport": "dispatcher.servicebus.transport",
}

__all__ = [
    "GeoReplicatedTransport",
    "InMemoryTransport",
    "ServiceBusTransport",
    "SqlClaimLog",
    "SqlQueueTransport",
    "Transport",
    "TransportMessage",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)

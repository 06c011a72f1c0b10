"""The durable SQL queue (Service Bus semantics on SQLite or PostgreSQL), its consumer and inboxes.

Build the queue from the workspace's settings, so the consumer honours its ``lock_duration`` and
``max_delivery_count``: ``SqlQueue.from_settings(ob.settings)`` (docs/guide.md, "Consuming").
``CosmosInbox`` needs the ``azure`` extra; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lazy import guard, lazy_exports

if TYPE_CHECKING:
    from dispatcher.queue.consumer import Consumer
    from dispatcher.queue.consumer_options import ConsumerOptions
    from dispatcher.queue.inbox import Inbox, SqlInbox
    from dispatcher.queue.inbox_cosmos import CosmosInbox
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
    from outbox.core.errors import LockLostError, UnprocessableMessageError

_EXPORTS = {
    "SqlQueue": "dispatcher.queue.sql_queue",
    "MAX_DELIVERY_REASON": "dispatcher.queue.sql_queue",
    "Consumer": "dispatcher.queue.consumer",
    "ConsumerOptions": "dispatcher.queue.consumer_options",
    "QueueMessage": "dispatcher.queue.messages",
    "ReceivedMessage": "dispatcher.queue.messages",
    "PeekedMessage": "dispatcher.queue.messages",
    "DeadLetter": "dispatcher.queue.messages",
    "DeferMessage": "dispatcher.queue.messages",
    "QueueStats": "dispatcher.queue.messages",
    "QueueSender": "dispatcher.queue.ports",
    "QueueReceiver": "dispatcher.queue.ports",
    "QueueAdministration": "dispatcher.queue.ports",
    "DeferringReceiver": "dispatcher.queue.ports",
    "Inbox": "dispatcher.queue.inbox",
    "SqlInbox": "dispatcher.queue.inbox",
    "CosmosInbox": "dispatcher.queue.inbox_cosmos",
    "ExponentialBackoff": "outbox.core.backoff",
    "UnprocessableMessageError": "outbox.core.errors",
    "LockLostError": "outbox.core.errors",
}

__all__ = [
    "MAX_DELIVERY_REASON",
    "Consumer",
    "ConsumerOptions",
    "CosmosInbox",
    "DeadLetter",
    "DeferMessage",
    "DeferringReceiver",
    "ExponentialBackoff",
    "Inbox",
    "LockLostError",
    "PeekedMessage",
    "QueueAdministration",
    "QueueMessage",
    "QueueReceiver",
    "QueueSender",
    "QueueStats",
    "ReceivedMessage",
    "SqlInbox",
    "SqlQueue",
    "UnprocessableMessageError",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, guard=guard)

"""The durable SQL queue (Service Bus semantics on SQLite or PostgreSQL) and its consumer."""

from dispatcher.queue.consumer import Consumer, ExponentialBackoff
from dispatcher.queue.messages import (
    DeadLetter,
    PeekedMessage,
    QueueMessage,
    QueueStats,
    ReceivedMessage,
)
from dispatcher.queue.sql_queue import MAX_DELIVERY_REASON, SqlQueue
from outbox.core.errors import UnprocessableMessageError

__all__ = [
    "MAX_DELIVERY_REASON",
    "Consumer",
    "DeadLetter",
    "ExponentialBackoff",
    "PeekedMessage",
    "QueueMessage",
    "QueueStats",
    "ReceivedMessage",
    "SqlQueue",
    "UnprocessableMessageError",
]

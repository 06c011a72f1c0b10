"""delta-outbox: documents and their outgoing messages in one Delta commit.

>>> from outbox import Outbox
>>> ob = Outbox.open(".outbox")          # doctest: +SKIP
"""

from outbox.app import Outbox
from outbox.core.clock import Clock, ManualClock, SystemClock
from outbox.core.errors import (
    ChangeDataFeedDisabledError,
    ClosedError,
    CommitConflictError,
    ConcurrencyError,
    ConfigurationError,
    LockLostError,
    MessageTooLargeError,
    OutboxError,
    SchemaMismatchError,
    SerializationError,
    ValidationError,
)
from outbox.core.model import DocumentRow, OutboxMessage, bucket_of, message_id_for
from outbox.core.settings import Settings
from outbox.unit_of_work import Document, UnitOfWork

__all__ = [
    "ChangeDataFeedDisabledError",
    "Clock",
    "ClosedError",
    "CommitConflictError",
    "ConcurrencyError",
    "ConfigurationError",
    "Document",
    "DocumentRow",
    "LockLostError",
    "ManualClock",
    "MessageTooLargeError",
    "Outbox",
    "OutboxError",
    "OutboxMessage",
    "SchemaMismatchError",
    "SerializationError",
    "Settings",
    "SystemClock",
    "UnitOfWork",
    "ValidationError",
    "bucket_of",
    "message_id_for",
]

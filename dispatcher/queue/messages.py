"""What goes into the queue and what comes out of it.

``QueueMessage`` is what a sender builds; ``ReceivedMessage`` adds what the broker assigned (the
sequence number, lock token, lock expiry, delivery count). Field names follow Azure Service Bus so
handlers move between the two unchanged.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.core.clock import utc
from outbox.core.errors import OutboxError


@dataclass(slots=True)  # not frozen, as TransportMessage: one per message on the hot path
class QueueMessage:
    """A message to send. Without a ``message_id`` a random one is generated (so it is never
    deduplicated); give a deterministic one to make re-sends safe. The body may be empty (or
    None): a signal whose meaning is in its subject and headers is an ordinary message."""

    body: bytes | str | None
    message_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    session_id: str | None = None
    not_before: datetime | None = None
    subject: str = ""
    content_type: str = "application/octet-stream"
    correlation_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)

    @property
    def body_bytes(self) -> bytes:
        """The body as bytes: ``None`` is an empty body, as on Service Bus."""
        if self.body is None:
            return b""
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A delivered message. Settle it with the lock token before ``locked_until``.

    ``lock_token`` and ``locked_until`` are None for messages from ``receive_and_delete``, which
    cannot be settled (they are already gone).
    """

    queue: str
    message_id: str
    body: bytes
    sequence_number: int
    enqueued_at: datetime
    delivery_count: int
    lock_token: str | None
    locked_until: datetime | None
    session_id: str | None = None
    subject: str = ""
    content_type: str = ""
    correlation_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A message seen without locking it: its state is ``active``, ``scheduled``, ``locked`` or
    ``deferred`` (set aside by ``defer``, received only by sequence number)."""

    queue: str
    message_id: str
    sequence_number: int
    session_id: str | None
    state: str
    delivery_count: int
    enqueued_at: datetime
    not_before: datetime
    locked_until: datetime | None
    subject: str
    content_type: str
    body: bytes
    #: when its current (or last) lock was taken; None if it was never received
    locked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message moved aside, with why: ``MaxDeliveryCountExceeded`` or a handler's reason."""

    id: int
    queue: str
    message_id: str
    session_id: str | None
    body: bytes
    subject: str
    content_type: str
    correlation_id: str | None
    headers: dict[str, Any]
    enqueued_at: datetime
    sequence_number: int
    delivery_count: int
    reason: str
    description: str
    dead_lettered_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Depth of one queue at one instant."""

    queue: str
    active: int = 0
    scheduled: int = 0
    locked: int = 0
    dead_lettered: int = 0
    #: set aside by ``defer`` and not locked (a received deferred message counts as locked)
    deferred: int = 0

    @property
    def total(self) -> int:
        return self.active + self.scheduled + self.locked + self.deferred


class DeferMessage(OutboxError):
    """A handler's outcome "not now": raise it, or return an instance, and the consumer defers the
    message (``receive_deferred`` brings it back by sequence number). Why an exception as well as
    a result: a handler deep in a call stack can say so without threading a value back up."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "deferred by the handler")
        self.reason = reason


def as_utc(value: datetime | None) -> datetime | None:
    """Drivers hand back naive datetimes on SQLite; every time in this package is aware UTC."""
    return None if value is None else utc(value)

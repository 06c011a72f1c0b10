"""What the fake broker stores and reports: entity properties (named as the SDK's
``QueueProperties`` and ``TopicProperties`` name them), runtime properties, each stored message.

Why apart: every other part of the fake reads these, and they hold no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
#: A batch's size limit when ``create_message_batch`` is given none (the Standard tier's 256 KB).
LINK_MAX_BYTES = 256 * 1024


@dataclass
class QueueSpec:
    """A queue's properties, named as ``QueueProperties`` names them."""

    name: str
    requires_session: bool = True
    requires_duplicate_detection: bool = True
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    max_delivery_count: int = 10
    lock_duration: timedelta = timedelta(seconds=30)


#: What the service gives a property ``create_queue`` leaves out (``QueueSpec``'s own defaults
#: are the command queue's shape, for tests that build a namespace directly).
SERVICE_QUEUE_DEFAULTS: dict[str, Any] = {
    "requires_session": False,
    "requires_duplicate_detection": False,
    "duplicate_detection_history_time_window": timedelta(minutes=10),
    "max_delivery_count": 10,
    "lock_duration": timedelta(minutes=1),
}


@dataclass
class TopicSpec:
    """A topic's properties, named as ``TopicProperties`` names them (service defaults)."""

    name: str
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)


@dataclass
class RuntimeProperties:
    """What ``get_queue_runtime_properties`` reports (locked messages count as active)."""

    name: str
    active_message_count: int
    scheduled_message_count: int
    dead_letter_message_count: int
    #: the fake has no auto-forwarding, so nothing is ever in transfer
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0

    @property
    def total_message_count(self) -> int:
        return self.active_message_count + self.scheduled_message_count


@dataclass
class Stored:
    """One message as the broker holds it."""

    seq: int
    message_id: str
    session_id: str | None
    body: bytes
    properties: dict[str, Any]
    subject: str | None
    content_type: str | None
    correlation_id: str | None
    enqueued_at: datetime
    visible_at: datetime
    deliveries: int = 0  # the broker's count, from 1; the AMQP header carries it minus one
    lock_token: str | None = None
    locked_until: datetime | None = None
    holder: str | None = None  # the receiver that holds the lock
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    deferred: bool = False  # set aside by defer_message: received only by sequence number


@dataclass
class QueueEntity:
    """A queue as the broker holds it: its messages, dead letters, seen ids and session locks."""

    spec: QueueSpec
    active: list[Stored] = field(default_factory=list)
    dead: list[Stored] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)
    sessions: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # id -> holder, until


@dataclass
class TopicEntity:
    """A topic as the broker holds it: what it accepted (no subscriptions are modelled)."""

    spec: TopicSpec
    accepted: list[Stored] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)


def body_bytes(body: Any) -> bytes:
    """A sent body as bytes: data sections joined; ``ServiceBusMessage(None)`` has none (b"")."""
    if body is None:
        return b""
    return body if isinstance(body, bytes) else b"".join(body)

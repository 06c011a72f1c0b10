"""Queue messages <-> Service Bus messages for the Service Bus command queue: the fields, the
application properties the adapter adds, and the derived ids of retry copies and requeues.

Why apart from the adapter: the receiver (``command_queue``) and the dead-letter subqueue
(``dead_letters``) read the same properties back; both import them from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC
from types import ModuleType
from typing import Any

from dispatcher.queue import validation
from dispatcher.queue.messages import DeadLetter, QueueMessage, ReceivedMessage
from outbox.core.clock import utc

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
#: Application properties the adapter adds (and removes again on receive).
PROP_ORIGINAL_ID = "outbox-original-id"
PROP_PRIOR_DELIVERIES = "outbox-prior-deliveries"
PROP_NO_SESSION = "outbox-no-session"
OURS = (PROP_ORIGINAL_ID, PROP_PRIOR_DELIVERIES, PROP_NO_SESSION)


def derived_id(message_id: str, tag: str) -> str:
    """``<message_id>+<tag>``: the id of a copy (``tag`` = deliveries so far for a retry,
    ``r<sequence number>`` for a requeue), hashed down when it would pass 128 characters."""
    candidate = f"{message_id}+{tag}"
    if len(candidate) <= validation.MAX_ID:
        return candidate
    return f"{hashlib.sha256(message_id.encode()).hexdigest()[:64]}+{tag}"


def text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def properties(m: Any) -> dict[str, Any]:
    """A received message's application properties with str keys and str values (the SDK hands
    back bytes)."""
    return {text(k): text(v) for k, v in (m.application_properties or {}).items()}


def body(m: Any) -> bytes:
    """The body as bytes; a message sent with ``ServiceBusMessage(None)`` has no body (b"")."""
    if m.body is None:
        return b""
    return m.body if isinstance(m.body, bytes) else b"".join(m.body)


def deliveries(m: Any, props: Mapping[str, Any]) -> int:
    """Deliveries so far: the AMQP header counts from 0, plus what a retry copy carries."""
    return int(props.get(PROP_PRIOR_DELIVERIES) or 0) + int(m.delivery_count or 0) + 1


def to_sdk(sb: ModuleType, msg: QueueMessage, *, extra: Mapping[str, Any] | None = None) -> Any:
    """The ``ServiceBusMessage``; a message without a session becomes a session of its own."""
    props: dict[str, Any] = dict(msg.headers)
    if msg.session_id is None:
        props[PROP_NO_SESSION] = "1"
    props.update(extra or {})
    when = msg.not_before
    return sb.ServiceBusMessage(
        msg.body_bytes,
        message_id=msg.message_id,
        session_id=msg.session_id or msg.message_id,
        scheduled_enqueue_time_utc=None if when is None else utc(when).astimezone(UTC),
        subject=msg.subject or None,
        content_type=msg.content_type or None,
        correlation_id=msg.correlation_id,
        application_properties=props or None,
    )


def to_received(queue: str, m: Any, locked_until: Any) -> ReceivedMessage:
    props = properties(m)
    return ReceivedMessage(
        queue=queue,
        message_id=str(props.get(PROP_ORIGINAL_ID) or m.message_id),
        body=body(m),
        sequence_number=int(m.sequence_number),
        enqueued_at=utc(m.enqueued_time_utc),
        delivery_count=deliveries(m, props),
        lock_token=str(m.lock_token),
        locked_until=None if locked_until is None else utc(locked_until),
        session_id=None if props.get(PROP_NO_SESSION) else m.session_id,
        subject=m.subject or "",
        content_type=m.content_type or "",
        correlation_id=m.correlation_id,
        headers={k: v for k, v in props.items() if k not in OURS},
    )


def to_dead_letter(queue: str, m: Any) -> DeadLetter:
    props = properties(m)
    return DeadLetter(
        id=int(m.sequence_number),
        queue=queue,
        message_id=str(props.get(PROP_ORIGINAL_ID) or m.message_id),
        session_id=None if props.get(PROP_NO_SESSION) else m.session_id,
        body=body(m),
        subject=m.subject or "",
        content_type=m.content_type or "",
        correlation_id=m.correlation_id,
        headers={k: v for k, v in props.items() if k not in OURS},
        enqueued_at=utc(m.enqueued_time_utc),
        sequence_number=int(m.sequence_number),
        delivery_count=deliveries(m, props),
        reason=m.dead_letter_reason or "",
        description=m.dead_letter_error_description or "",
        # Service Bus keeps no dead-lettering time; the enqueue time is the nearest it has.
        dead_lettered_at=utc(m.enqueued_time_utc),
    )

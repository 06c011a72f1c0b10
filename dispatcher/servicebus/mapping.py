"""``TransportMessage`` -> ``ServiceBusMessage``, and the checks Service Bus would otherwise fail
late (ids and entity names too long or malformed), each as a ``PermanentTransportError`` naming
the message, raised before anything of the batch is sent.

Field mapping (see docs/servicebus.md): message_id -> message_id, session_id -> session_id
(partition_key is left unset: the service then partitions by session_id), scheduled_at ->
scheduled_enqueue_time_utc, headers -> application_properties, subject, content_type and
correlation_id one to one, body -> body.
"""

from __future__ import annotations

import re
from datetime import UTC
from types import ModuleType
from typing import TYPE_CHECKING

from dispatcher.transports.base import TransportMessage
from outbox.core.errors import PermanentTransportError, UnknownDestinationError

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage

#: Service Bus limits on message_id, session_id and partition_key, and on entity paths.
MAX_ID_LENGTH = 128
MAX_ENTITY_NAME_LENGTH = 260
_ENTITY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


def to_servicebus(sb: ModuleType, m: TransportMessage) -> ServiceBusMessage:
    """The ``ServiceBusMessage`` for ``m`` (``PermanentTransportError`` when it is invalid);
    ``sb`` is the loaded ``azure.servicebus`` module."""
    for what, value in (("message_id", m.message_id), ("session_id", m.session_id)):
        if value is not None and len(value) > MAX_ID_LENGTH:
            raise PermanentTransportError(
                f"message {m.message_id[:MAX_ID_LENGTH]}...: {what} is {len(value)} "
                "characters; "
                f"Service Bus allows at most {MAX_ID_LENGTH}",
                message_id=m.message_id,
            )
    if not m.message_id:
        raise PermanentTransportError(
            "a message has an empty message_id; duplicate detection needs one", message_id=""
        )
    when = m.scheduled_at
    if when is not None:  # naive means UTC; the SDK would read a naive time as local time
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    try:
        message: ServiceBusMessage = sb.ServiceBusMessage(
            m.body,
            # Always ours: scheduling would otherwise assign a random id (no dedup).
            message_id=m.message_id,
            session_id=m.session_id or None,
            # partition_key stays unset: with a session_id the service partitions by it, and
            # the SDK refuses a partition_key that differs from session_id.
            scheduled_enqueue_time_utc=when,
            content_type=m.content_type or None,
            correlation_id=m.correlation_id,
            subject=m.subject or None,
            application_properties=dict(m.headers) if m.headers else None,
        )
    except (ValueError, TypeError) as e:
        raise PermanentTransportError(
            f"message {m.message_id}: Service Bus refuses it: {e}", message_id=m.message_id
        ) from e
    return message


def check_destination(m: TransportMessage) -> str:
    """``m.destination`` if it can name a Service Bus queue or topic, else
    ``UnknownDestinationError``."""
    name = m.destination
    if not name or len(name) > MAX_ENTITY_NAME_LENGTH or not _ENTITY_NAME.match(name):
        raise UnknownDestinationError(
            f"message {m.message_id}: {name!r} cannot be a Service Bus queue or topic name",
            message_id=m.message_id,
            hint="entity names are 1-260 letters, digits, '.', '-', '_' or '/', starting "
            "with a letter or digit",
        )
    return name

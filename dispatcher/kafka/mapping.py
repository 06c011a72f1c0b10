"""Which Kafka field carries which message field: the producer writes it, the consumer helper
and the Spark sink read or write the same names.

The ordering key (``session_id``) is the Kafka key, so a key's messages share a partition and
keep their order there. The value is the body. The id, subject, content type and correlation id
travel as headers under the names below; the message's own headers (``traceparent`` included)
follow as they are. A header may not use a reserved name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dispatcher.transports.base import TransportMessage

MESSAGE_ID = "outbox-message-id"
SUBJECT = "outbox-subject"
CONTENT_TYPE = "content-type"
CORRELATION_ID = "outbox-correlation-id"
RESERVED = frozenset((MESSAGE_ID, SUBJECT, CONTENT_TYPE, CORRELATION_ID))

#: Kafka's rule for topic names (and Event Hubs': hub names are a subset of it).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def topic_problem(name: str) -> str | None:
    """Why ``name`` cannot be a Kafka topic, or None."""
    if not _TOPIC.match(name):
        return "is not a Kafka topic name (1 to 249 of letters, digits, '.', '_', '-')"
    if name in (".", ".."):
        return "is not a Kafka topic name"
    return None


def headers_of(m: TransportMessage) -> list[tuple[str, bytes]]:
    """The Kafka headers of ``m``: its fields under the reserved names, then its own headers."""
    out = [(MESSAGE_ID, m.message_id.encode())]
    if m.subject:
        out.append((SUBJECT, m.subject.encode()))
    if m.content_type:
        out.append((CONTENT_TYPE, m.content_type.encode()))
    if m.correlation_id:
        out.append((CORRELATION_ID, m.correlation_id.encode()))
    if m.headers:
        out += [(k, str(v).encode()) for k, v in m.headers.items()]
    return out


def reserved_header(m: TransportMessage) -> str | None:
    for k in m.headers:
        if k in RESERVED:
            return k
    return None


def from_kafka(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> TransportMessage:
    """A ``TransportMessage`` back from a Kafka record (for the consumer helper and tests).

    A record another producer wrote, without ``outbox-message-id``, gets ``""`` as its id."""
    fields: dict[str, str] = {}
    own: dict[str, str] = {}
    for name, raw in headers or ():
        text = (raw or b"").decode("utf-8", "replace")
        if name in RESERVED:
            fields[name] = text
        else:
            own[name] = text
    return TransportMessage(
        message_id=fields.get(MESSAGE_ID, ""),
        destination=topic,
        body=value or b"",
        subject=fields.get(SUBJECT, ""),
        content_type=fields.get(CONTENT_TYPE, ""),
        session_id=key.decode("utf-8", "replace") if key is not None else None,
        correlation_id=fields.get(CORRELATION_ID) or None,
        headers=own,
    )


def record_of(msg: Any) -> TransportMessage:
    """``from_kafka`` for a ``confluent_kafka.Message``."""
    return from_kafka(msg.topic(), msg.key(), msg.value(), msg.headers())

"""The document and its outgoing messages: the shapes every other part agrees on.

A document row carries its own pending messages, so the state change and the messages commit in
one Delta commit. The pure functions here (message ids, the bucket of an id, what is pending) are
documented in the README so that another writer, a Spark job say, computes the same values.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.core.errors import MessageTooLargeError, SerializationError, ValidationError

#: Service Bus caps message_id, session_id and partition_key at 128 characters; we do too.
MAX_ID_LENGTH = 128
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024

_DESTINATION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,259}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def bucket_of(doc_id: str, buckets: int) -> int:
    """Partition bucket of a document: ``crc32(utf8(id)) % buckets``.

    Spark SQL computes the same value with ``crc32(id) % N`` (both are unsigned CRC-32).
    """
    return zlib.crc32(doc_id.encode("utf-8")) % buckets


def message_id_for(table_id: str, doc_id: str, seq: int) -> str:
    """Deterministic message id: every re-send of (table, document, seq) carries the same id.

    ``substr(sha2(concat(table_id, '|', id, '|', cast(seq as string)), 256), 1, 32)`` in Spark SQL.
    """
    raw = f"{table_id}|{doc_id}|{seq}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def command_id_for(table_id: str, doc_id: str, up_to_seq: int) -> str:
    """Id of the ``ProcessDocument`` command for a document at ``up_to_seq``.

    The same (table, id, last_seq) always yields the same command id, so the queue's duplicate
    detection turns a repeated rescue pass into a no-op.
    """
    raw = f"process|{table_id}|{doc_id}|{up_to_seq}".encode()
    return "pd-" + hashlib.sha256(raw).hexdigest()[:32]


def validate_id(value: object, what: str = "document id") -> str:
    """Ids are non-empty strings of at most 128 characters without control characters."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_LENGTH:
        raise ValidationError(
            f"{what} is {len(value)} characters; the limit is {MAX_ID_LENGTH}",
            hint="use a shorter id (Service Bus caps ids at 128 characters)",
        )
    if _CONTROL.search(value):
        raise ValidationError(f"{what} {value!r} contains control characters")
    return value


def validate_destination(value: object) -> str:
    """A destination is a queue or topic name: letters, digits, ``. _ - /``, at most 260 chars."""
    if not isinstance(value, str) or not value:
        raise ValidationError(
            f"destination must be a non-empty queue or topic name, got {value!r}",
            hint='pass destination="shipments" (or set a default destination)',
        )
    if not _DESTINATION.match(value):
        raise ValidationError(
            f"destination {value!r} is not a valid queue or topic name",
            hint="use letters, digits and . _ - / only, starting with a letter or digit",
        )
    return value


def encode_json(value: Any, what: str) -> str:
    """Compact, key-sorted JSON; a clear error for what JSON cannot hold."""
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SerializationError(
            f"{what} cannot be serialized to JSON: {e}",
            hint="use dicts, lists, strings, numbers, booleans and None (convert dates to text)",
        ) from e


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One outgoing message as stored inside a document row."""

    seq: int
    message_id: str
    destination: str
    type: str
    body: str
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    ordering_key: str | None = None
    correlation_id: str | None = None
    deliver_at: datetime | None = None
    created_at: datetime | None = None

    def size_bytes(self) -> int:
        return len(self.body.encode("utf-8")) + sum(
            len(k) + len(v) for k, v in self.headers.items()
        )


def check_size(message: OutboxMessage, limit: int) -> None:
    size = message.size_bytes()
    if size > limit:
        raise MessageTooLargeError(
            f"message {message.type!r} for {message.destination!r} is {size} bytes; "
            f"the limit is {limit}",
            hint="send a reference to the data instead, or raise max_message_bytes",
        )


@dataclass(slots=True)
class DocumentRow:
    """A document exactly as stored (what the store reads and writes)."""

    id: str
    type: str
    version: int
    state: dict[str, Any]
    last_seq: int
    dispatched_seq: int
    outbox: list[OutboxMessage]
    updated_at: datetime | None = None

    def pending(self) -> list[OutboxMessage]:
        """Messages not yet accepted by a transport, in seq order (``dispatched_seq < seq``)."""
        return sorted(
            (m for m in self.outbox if self.dispatched_seq < m.seq <= self.last_seq),
            key=lambda m: m.seq,
        )

    @property
    def has_pending(self) -> bool:
        return self.last_seq > self.dispatched_seq

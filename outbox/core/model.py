"""The document and its outgoing messages: the shapes every other part agrees on.

A document row carries its own pending messages, so the state change and the messages commit in
one Delta commit. The pure functions here (message ids, the bucket of an id, what is pending) are
documented in docs/table.md and docs/delta.md so that another writer, a Spark job say, computes the
same values.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
import re
import zlib
from collections.abc import Mapping
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


def new_incarnation() -> str:
    """A fresh document incarnation: 32 lowercase hex characters, 128 random bits (what a uuid4
    without dashes looks like; drawn without building a ``UUID``, a quarter of its cost: one is
    drawn per new document).

    Why: a document deleted outside the library (a retention or erasure job) and created again
    restarts at seq 1. Without something that tells the two lives apart, its new messages would
    carry the ids of the old ones, and every duplicate detection downstream (the SQL queue,
    Service Bus, a consumer's inbox) would drop them: a loss. Other writers may draw it with
    ``replace(uuid(), '-', '')`` in Spark SQL; any token without ``|`` that is longer than 19
    characters keeps the ids unambiguous (``cast(seq as string)`` never is).
    """
    return os.urandom(16).hex()


def _id_source(parts: list[str], incarnation: str | None) -> bytes:
    """``concat_ws('|', ...)``: a null incarnation is skipped, which is the pre-incarnation form."""
    if incarnation is not None:
        parts.append(incarnation)
    return "|".join(parts).encode()


def message_id_for(table_id: str, doc_id: str, seq: int, incarnation: str | None = None) -> str:
    """Deterministic message id: every re-send of (table, document incarnation, seq) carries the
    same id, and a re-created document (a new incarnation) never repeats an old one.

    In Spark SQL: ``substr(sha2(concat_ws('|', table_id, id, cast(seq as string), incarnation),
    256), 1, 32)``. ``concat_ws`` skips a null, so a row written before incarnations existed
    (``incarnation`` null) keeps exactly its old ids: ``table_id|id|seq``.
    """
    return hashlib.sha256(_id_source([table_id, doc_id, str(seq)], incarnation)).hexdigest()[:32]


def command_id_for(
    table_id: str, doc_id: str, up_to_seq: int, incarnation: str | None = None
) -> str:
    """Id of the ``ProcessDocument`` command for a document incarnation at ``up_to_seq``.

    The same (table, id, last_seq, incarnation) always yields the same command id, so the queue's
    duplicate detection turns a repeated rescue pass into a no-op, while a re-created document's
    command is never dropped as a repeat of its predecessor's. In Spark SQL: ``concat('pd-',
    substr(sha2(concat_ws('|', 'process', table_id, id, cast(last_seq as string), incarnation),
    256), 1, 32))``.
    """
    raw = _id_source(["process", table_id, doc_id, str(up_to_seq)], incarnation)
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


@functools.lru_cache(maxsize=64)
def _encoded_text_headers(items: tuple[tuple[str, str], ...]) -> str:
    return json.dumps(dict(items), separators=(",", ":"), sort_keys=True)


#: The last all-text headers encoded and their JSON, swapped as one tuple (thread safe).
_last_headers: list[tuple[dict[str, str], str]] = [({}, "{}")]


def encode_headers(headers: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON of message headers.

    Why the caches: with tracing on, every message of a unit of work carries the same
    ``traceparent``, and its headers are encoded on the way into Delta and again into the queue;
    encoding one small dict per message cost about half of tracing's overhead on a
    1,000-document unit of work (docs/observability.md). The last headers are compared first (a
    dict comparison, no sort); only all-text headers are cached, so ``True == 1`` never lets
    ``{"a": 1}`` reuse ``{"a": "true"}``'s JSON (a cached dict's values are all ``str``, and
    only a ``str`` equals one).
    """
    last = _last_headers[0]
    if headers == last[0]:
        return last[1]
    if all(type(k) is str and type(v) is str for k, v in headers.items()):
        encoded = _encoded_text_headers(tuple(sorted(headers.items())))
        _last_headers[0] = (dict(headers), encoded)
        return encoded
    return json.dumps(dict(headers), separators=(",", ":"), sort_keys=True)


#: ``json.dumps(separators=(",", ":"), sort_keys=True, allow_nan=False)``'s encoder, built once
#: (``json.dumps`` builds one a call: 40% of encoding a small state).
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)


def encode_json(value: Any, what: str) -> str:
    """Compact, key-sorted JSON; a clear error for what JSON cannot hold."""
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as e:
        raise SerializationError(
            f"{what} cannot be serialized to JSON: {e}",
            hint="use dicts, lists, strings, numbers, booleans and None (convert dates to text)",
        ) from e


_seq = operator.attrgetter("seq")


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
        """What a broker counts against its size limit: the body and the properties, as UTF-8
        bytes (the message id, type, content type, session, correlation id, and each header's
        key and value). Why bytes and not ``len``: a header of 1,000 ``é`` is 2,000 bytes on the
        wire, and a character count let a message over Service Bus's 256 KiB limit through."""
        size = len(self.body.encode("utf-8")) + _utf8_len(self.message_id) + _utf8_len(self.type)
        size += _utf8_len(self.content_type)
        if self.ordering_key:
            size += _utf8_len(self.ordering_key)
        if self.correlation_id:
            size += _utf8_len(self.correlation_id)
        for k, v in self.headers.items():
            size += _utf8_len(k) + _utf8_len(v if type(v) is str else str(v))
        return size


def _utf8_len(text: str) -> int:
    """UTF-8 length without encoding ASCII text (the usual case: ids and names)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


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
    #: Drawn when the document is created, never changed by updates; None for rows written
    #: before incarnations existed (their message ids keep the old formula). See
    #: ``new_incarnation``.
    incarnation: str | None = None
    #: A tombstone: the document's last version, written by ``UnitOfWork.delete``. It carries
    #: the document's last messages (they leave like any other) and no state; readers of
    #: current documents skip it, the dispatcher does not (docs/design.md, section 2).
    deleted: bool = False

    def pending(self) -> list[OutboxMessage]:
        """Messages not yet accepted by a transport, in seq order (``dispatched_seq < seq``)."""
        low, high = self.dispatched_seq, self.last_seq
        out = [m for m in self.outbox if low < m.seq <= high]
        if len(out) > 1:
            out.sort(key=_seq)
        return out

    @property
    def has_pending(self) -> bool:
        return self.last_seq > self.dispatched_seq

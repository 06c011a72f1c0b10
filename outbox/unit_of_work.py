"""The unit of work: load documents, change them, add messages, commit once.

A unit of work is one Delta commit. Documents it touched are saved together with their new
messages, or nothing is: an exception inside the ``with`` block discards everything, and a stale
document raises ``ConcurrencyError`` before anything is written.

A delete (``UnitOfWork.delete``) is a save too: the document's next version, a *tombstone*
(``deleted``, no state) carrying its unsent messages and any sent on it in this unit of work, its
last ones. Why not a physical delete: the tombstone races saves exactly as a save does (the same
re-check and per-document application transaction), and its last messages leave like any other,
through the dispatcher or, after a crash, the rescuer; the fold removes its rows once they have
(docs/design.md, section 2).

Why one module: a ``Document`` is a view into its unit of work (it checks the unit of work is
open, numbers its messages with the unit of work's table id and clock, and the unit of work reads
its private state to commit it); split, each half would reach into the other's internals.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from outbox.core import telemetry
from outbox.core.clock import Clock, utc
from outbox.core.errors import (
    ClosedError,
    ConcurrencyError,
    DocumentNotFoundError,
    SerializationError,
    TombstoneNotSentError,
    ValidationError,
)
from outbox.core.model import (
    DocumentRow,
    OutboxMessage,
    check_size,
    encode_json,
    message_id_for,
    new_incarnation,
    validate_destination,
    validate_id,
)
from outbox.core.settings import did_you_mean
from outbox.delta.store import DeltaDocumentStore, DocumentWrite

if TYPE_CHECKING:
    from outbox.core.settings import Settings


class Document:
    """A document inside a unit of work. Change ``state`` freely; ``send`` adds a message."""

    def __init__(self, uow: UnitOfWork, row: DocumentRow, *, is_new: bool, read_at: int) -> None:
        self._uow = uow
        self._row = row
        self._is_new = is_new
        self._read_at = read_at
        # The state as encoded when read (and, once checked, now): one encoding per save serves
        # the change check, the serializability check and the appended row.
        self._original_state = encode_json(row.state, "state") if not is_new else None
        self._encoded: str | None = None
        self._original_type = row.type
        self.state: dict[str, Any] = row.state
        self.new_messages: list[OutboxMessage] = []
        self._deleted_at: str | None = None  # the state's encoding when deleted (None: live)

    @property
    def id(self) -> str:
        return self._row.id

    @property
    def type(self) -> str:
        return self._row.type

    @property
    def version(self) -> int:
        """The version this document was read at (0 for a document created here)."""
        return 0 if self._is_new else self._row.version

    @property
    def incarnation(self) -> str | None:
        """Which life of this id the document is (None: created before incarnations existed)."""
        return self._row.incarnation

    @property
    def last_seq(self) -> int:
        return self._row.last_seq + len(self.new_messages)

    @property
    def dispatched_seq(self) -> int:
        return self._row.dispatched_seq

    def send(
        self,
        type: str,
        body: Any,
        *,
        destination: str | None = None,
        ordering_key: str | None = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
        correlation_id: str | None = None,
        deliver_at: datetime | None = None,
    ) -> OutboxMessage:
        """Add an outgoing message; it is committed with the document and sent after the commit.

        ``body`` may be JSON-serializable data, a ``str`` or UTF-8 ``bytes``. ``ordering_key``
        defaults to the document id, which gives per-document order (a Service Bus session).
        """
        self._uow._check_open()
        if self._deleted_at is not None:
            raise ValidationError(
                f"document {self.id!r} was deleted in this unit of work; nothing can be sent on "
                "it now",
                hint="send its last messages before uow.delete(...): they leave with the delete",
            )
        if not isinstance(type, str) or not type.strip():
            raise ValidationError(f"message type must be a non-empty string, got {type!r}")
        dest = validate_destination(destination or self._uow.default_destination)
        declared = self._uow.declared_destinations
        if declared and dest not in declared:  # a typo would commit to a queue no one reads
            raise ValidationError(
                f"destination {dest!r} is not declared{did_you_mean(dest, declared)}; nothing "
                "was written",
                hint=f"send to one of {', '.join(sorted(declared))}, or add it to the "
                "destinations setting (OUTBOX_DESTINATIONS)",
            )
        if isinstance(body, bytes):
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SerializationError(
                    f"message {type!r}: bytes bodies must be UTF-8 text",
                    hint="base64-encode binary data and set content_type",
                ) from e
            ctype = content_type or "application/octet-stream"
        elif isinstance(body, str):
            text, ctype = body, content_type or "text/plain"
        else:
            text, ctype = (
                encode_json(body, f"message {type!r} body"),
                content_type or ("application/json"),
            )
        if headers is not None and (
            not isinstance(headers, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise ValidationError(f"message {type!r}: headers must be a dict of str to str")
        key = validate_id(ordering_key, "ordering key") if ordering_key is not None else self.id
        if correlation_id is not None:
            validate_id(correlation_id, "correlation id")
        if deliver_at is not None and (
            not isinstance(deliver_at, datetime) or deliver_at.tzinfo is None
        ):
            raise ValidationError(
                f"message {type!r}: deliver_at must be a timezone-aware datetime, "
                f"got {deliver_at!r}",
                hint="use datetime.now(UTC) + timedelta(...); a naive time is ambiguous",
            )
        seq = self.last_seq + 1
        carried = dict(headers or {})
        telemetry.inject_headers(carried)  # the request's trace goes with the message
        msg = OutboxMessage(
            seq=seq,
            message_id=message_id_for(self._uow.table_id, self.id, seq, self.incarnation),
            destination=dest,
            type=type,
            body=text,
            content_type=ctype,
            headers=carried,
            ordering_key=key,
            correlation_id=correlation_id,
            deliver_at=utc(deliver_at) if deliver_at is not None else None,
            created_at=self._uow.now(),
        )
        check_size(msg, self._uow.max_message_bytes)
        self.new_messages.append(msg)
        return msg

    def _changed(self) -> bool:
        self._check_state()
        if self._deleted_at is not None:
            if encode_json(self.state, f"state of document {self.id!r}") != self._deleted_at:
                raise ValidationError(
                    f"the state of document {self.id!r} changed after it was deleted in this "
                    "unit of work; nothing was written",
                    hint="change a document before deleting it, or not at all",
                )
            return True
        if self._is_new or self.new_messages:
            return True
        self._encoded = encode_json(self.state, f"state of document {self.id!r}")
        return self._original_state != self._encoded

    def _check_state(self) -> None:
        """``state`` is a plain attribute, so a whole new value (a list, None, a number) would
        otherwise reach the table; ``create`` and the Spark path accept only a JSON object."""
        if not isinstance(self.state, dict):
            raise ValidationError(
                f"state of document {self.id!r} must be a JSON object (a dict), got "
                f"{type(self.state).__name__}; nothing was written",
                hint="assign a dict to doc.state, or change its keys in place",
            )

    def _write(self, now: datetime) -> DocumentWrite:
        deleted = self._deleted_at is not None
        if deleted:
            encoded = "{}"  # a tombstone keeps no state
        else:
            encoded = self._encoded or encode_json(self.state, f"state of document {self.id!r}")
        row = self._row
        # Drop what the dispatcher already sent (at or below the watermark we read): a save never
        # brings a sent message back (I4).
        kept = [m for m in row.outbox if m.seq > row.dispatched_seq]
        new_row = DocumentRow(
            id=row.id,
            type=row.type,
            version=row.version + 1,  # a create's row holds 0, or the tombstone it follows
            state={} if deleted else self.state,
            last_seq=self.last_seq,
            dispatched_seq=row.dispatched_seq,
            outbox=kept + self.new_messages,
            updated_at=now,
            incarnation=row.incarnation,
            deleted=deleted,
        )
        return DocumentWrite(new_row, self.version, self._read_at, encoded)


class UnitOfWork:
    """Use as a context manager; it commits on a clean exit and discards on an exception."""

    def __init__(
        self,
        store: DeltaDocumentStore,
        settings: Settings,
        clock: Clock,
        on_commit: Callable[[Sequence[DocumentRow], int], None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_commit = on_commit
        self.default_destination = settings.default_destination
        self.declared_destinations = settings.declared_destinations
        self.max_message_bytes = settings.max_message_bytes
        self.table_id = store.table_id
        self._docs: dict[str, Document] = {}
        self._absent: dict[str, int] = {}  # id -> version at which it was seen missing
        self._tombstones: dict[str, DocumentRow] = {}  # absent ids whose newest row is one
        self._closed = False
        self.committed_version: int | None = None
        self.saved: list[DocumentRow] = []

    def now(self) -> datetime:
        return self._clock.now()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(
                "this unit of work is closed (it already committed or was discarded)",
                hint="start a new one with `with outbox.unit_of_work() as uow:`",
            )

    # --- loading ----------------------------------------------------------------------------

    def get(self, doc_id: str) -> Document | None:
        """The document, or None when it does not exist (or was deleted)."""
        return self.get_many([doc_id]).get(doc_id)

    def get_many(self, ids: Sequence[str]) -> dict[str, Document]:
        """Load several documents with one read. A deleted one is absent."""
        self._check_open()
        for i in ids:
            validate_id(i)
        missing = [i for i in dict.fromkeys(ids) if i not in self._docs and i not in self._absent]
        if missing:
            version, rows = self._store.read(missing, barrier=False)
            for i in missing:
                row = rows.get(i)
                if row is not None and not row.deleted:
                    self._docs[i] = Document(self, row, is_new=False, read_at=version)
                else:
                    self._absent[i] = version
                    if row is not None:
                        self._tombstones[i] = row
        docs = self._docs
        return {i: docs[i] for i in ids if i in docs and docs[i]._deleted_at is None}

    def delete(self, doc_or_id: Document | str) -> None:
        """Delete a document: on commit, its next version is a tombstone (no state) carrying its
        unsent messages and those sent on it in this unit of work, its last. It races saves as a
        save does (``ConcurrencyError`` for the later one). Afterwards, this unit of work can
        neither change nor create it; ``DocumentNotFoundError`` when it does not exist."""
        self._check_open()
        if isinstance(doc_or_id, Document):
            if doc_or_id._uow is not self:
                raise ValidationError(
                    f"document {doc_or_id.id!r} belongs to another unit of work",
                    hint="delete it by id, or in the unit of work that read it",
                )
            doc_id = doc_or_id.id
        else:
            doc_id = validate_id(doc_or_id)
        doc = self.get(doc_id)
        if doc is None:
            what = "was deleted" if doc_id in self._docs or doc_id in self._tombstones else ""
            raise DocumentNotFoundError(
                f"document {doc_id!r} {what or 'does not exist'}; nothing to delete",
                hint="a unit of work deletes a document once, and only one that exists",
            )
        doc._deleted_at = encode_json(doc.state, f"state of document {doc_id!r}")

    def create(self, doc_id: str, *, type: str, state: dict[str, Any] | None = None) -> Document:
        """A new document; the commit fails with ``ConcurrencyError`` if the id exists by then."""
        self._check_open()
        validate_id(doc_id)
        validate_id(type, "document type")
        if doc_id in self._docs:
            if self._docs[doc_id]._deleted_at is not None:
                raise ValidationError(
                    f"document {doc_id!r} was deleted in this unit of work; it cannot be "
                    "created again in it",
                    hint="commit the delete, then create it in a new unit of work",
                )
            raise ConcurrencyError(
                f"document {doc_id!r} already exists", hint="use uow.get() to change it"
            )
        tomb = self._tombstones.get(doc_id)
        if tomb is not None and tomb.has_pending:
            tomb = self._tombstone_now(doc_id)
        if tomb is not None and tomb.has_pending:
            raise ConcurrencyError(
                f"document {doc_id!r} was deleted and its last messages are not sent yet",
                hint="retry the unit of work shortly: the dispatcher sends them, then the id "
                "is free",
            )
        if state is not None and not isinstance(state, dict):
            raise ValidationError(
                f"state of document {doc_id!r} must be a JSON object (a dict), got "
                f"{state.__class__.__name__}"
            )
        encoded = encode_json(state or {}, f"state of document {doc_id!r}")
        read_at = self._absent.get(doc_id, -1)  # -1: never checked, so the store re-checks
        row = DocumentRow(
            id=doc_id,
            type=type,
            version=tomb.version if tomb is not None else 0,  # a new life continues numbering
            state=json.loads(encoded) if state else {},  # a private copy (faster than deepcopy)
            last_seq=0,
            dispatched_seq=0,
            outbox=[],
            # A new life for this id: a document deleted outside the library and created again
            # restarts at seq 1, and must not repeat its predecessor's message ids.
            incarnation=new_incarnation(),
        )
        doc = Document(self, row, is_new=True, read_at=read_at)
        self._docs[doc_id] = doc
        self._absent.pop(doc_id, None)
        return doc

    def _tombstone_now(self, doc_id: str) -> DocumentRow | None:
        """The id's tombstone read again, after this process's unwritten watermarks (the read's
        barrier): a delete's last messages sent a moment ago by this process are marked only
        there, and a create right after the delete must not wait for the next watermark write."""
        version, rows = self._store.read([doc_id])
        row = rows.get(doc_id)
        self._absent[doc_id] = version
        if row is not None and not row.deleted:
            raise ConcurrencyError(
                f"document {doc_id!r} already exists", hint="use uow.get() to change it"
            )
        if row is None:
            self._tombstones.pop(doc_id, None)
            return None
        self._tombstones[doc_id] = row
        return row

    # --- finishing --------------------------------------------------------------------------

    def commit(self) -> int | None:
        """Save every changed document in one Delta commit; returns the table version."""
        self._check_open()
        try:
            return self._commit()
        finally:
            self._release()

    def _release(self) -> None:
        """Drop the documents once closed. Why: each ``Document`` refers back to its unit of
        work, so the two formed a reference cycle that only the garbage collector could free;
        a 1,000-document unit of work left thousands of objects to it, and its full collections
        (tens of ms) landed inside later dispatches. Without the cycle, reference counting frees
        them at once (a ``Document`` the application keeps still works: every call on it says
        the unit of work is closed)."""
        self._docs = {}

    def _commit(self) -> int | None:
        started = time.perf_counter()
        with telemetry.span("outbox.commit") as span:
            try:
                now = self._clock.now()
                writes = [d._write(now) for d in self._docs.values() if d._changed()]
                if not writes:
                    return None
                retries = self._store.commit_retries
                try:
                    version = self._store.save(writes)
                except TombstoneNotSentError as e:
                    version = self._save_after_marks(writes, e)
                span.set_attribute("outbox.commit.retries", self._store.commit_retries - retries)
                self.committed_version = version
                self.saved = [w.row for w in writes]
            finally:
                self._closed = True
            span.set_attribute("outbox.documents", len(writes))
            span.set_attribute(
                "outbox.messages", sum(len(d.new_messages) for d in self._docs.values())
            )
            span.set_attribute("outbox.delta.version", version)
        telemetry.instrument(
            "histogram", "outbox.commit.duration", "s", "one unit-of-work commit"
        ).record(time.perf_counter() - started)
        if self._on_commit is not None:
            self._on_commit(self.saved, version)
        return version

    def _save_after_marks(self, writes: list[DocumentWrite], error: Exception) -> int:
        """A create met a tombstone whose last messages are not marked sent: this process may
        have sent them a moment ago, its marks not written yet. The read's barrier writes them;
        if that marks the tombstone sent, save again (once), else the error stands."""
        _, rows = self._store.read([w.row.id for w in writes if w.expected_version == 0])
        if any(r.deleted and r.has_pending for r in rows.values()):
            raise error
        return self._store.save(writes)

    def discard(self) -> None:
        self._closed = True
        self._release()

    def __enter__(self) -> UnitOfWork:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.discard()
            return
        if not self._closed:
            self.commit()

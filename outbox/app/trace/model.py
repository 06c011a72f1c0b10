"""The answer of ``outbox trace``: typed, so the CLI's ``--json`` and a console page show the same
fields (their shape is documented in docs/trace.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Commit:
    """One row of the document the table's history holds (a version, a mark, a fold's delete)."""

    table_version: int
    committed_at: datetime | None
    #: outbox (the embedded writer), dispatcher (a mark), fold, erase, repair, spark, foreign
    writer: str
    operation: str  # commitInfo's operation, with outbox.operation in brackets
    change: str  # insert, update_postimage, delete
    document_version: int  # 0: a mark row (the watermark only)
    last_seq: int
    dispatched_seq: int
    added: list[str]  # message ids this row carried first


@dataclass(frozen=True)
class QueuedCopy:
    """The message waiting in the SQL queue (the queue stores a lock's end and start, and an
    opaque token nobody may be shown: who holds it is a receiver the queue does not name)."""

    queue: str
    state: str  # active, scheduled, deferred, locked
    sequence_number: int
    delivery_count: int
    enqueued_at: datetime
    not_before: datetime
    locked_at: datetime | None
    locked_until: datetime | None


@dataclass(frozen=True)
class DeadLettered:
    id: int
    queue: str
    reason: str
    description: str
    delivery_count: int
    dead_lettered_at: datetime


@dataclass
class MessageFate:
    seq: int
    message_id: str
    destination: str
    type: str
    session_id: str
    correlation_id: str | None
    created_at: datetime | None
    first_table_version: int | None  # None: written before the retained history
    #: pending, accepted, active, scheduled, deferred, locked or dead-lettered
    fate: str = "accepted"
    pending: bool = False
    pending_age_s: float | None = None
    queued: QueuedCopy | None = None
    dead_letter: DeadLettered | None = None


@dataclass(frozen=True)
class CommandSeen:
    """A ``ProcessDocument`` command for the document, in the command queue or dead-lettered."""

    command_id: str
    up_to_seq: int
    state: str  # a queue state, or dead-lettered
    delivery_count: int
    at: datetime  # enqueued, or dead-lettered
    dead_letter_id: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RescueSeen:
    """A rescue pass that commanded the document (the rescuer's journal, ``rescuer.journal``)."""

    at: datetime
    rescuer: str
    engine: str  # local or spark
    mode: str  # feed or sweep
    window_end: int | None  # the last table version the pass read
    up_to_seq: int  # what the command asked to be sent
    command_id: str


@dataclass
class DocumentTrace:
    id: str
    type: str
    incarnation: str | None
    version: int
    deleted: bool
    last_seq: int
    dispatched_seq: int
    history_from: int  # the first table version read
    commits: list[Commit] = field(default_factory=list)
    messages: list[MessageFate] = field(default_factory=list)
    commands: list[CommandSeen] = field(default_factory=list)
    rescues: list[RescueSeen] = field(default_factory=list)  # newest first
    notes: list[str] = field(default_factory=list)


@dataclass
class Trace:
    query: str
    matched_by: str  # document_id, message_id or correlation_id
    table_version: int
    documents: list[DocumentTrace]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

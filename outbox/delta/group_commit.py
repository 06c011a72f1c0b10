"""Group commit: the tickets units of work and watermark advances wait on, and the pure steps of
coalescing them into one commit.

While one thread commits, others queue a ``Ticket``; the next thread to hold the store's lock
commits every queued ticket it can in one append and finishes each with its own outcome. Why its
own module: these steps decide *which* tickets share a commit and *how each ends* (which batch,
which unit of work is stale, which watermark wins), and none of them takes a lock or touches the
table. The store (``outbox.delta.store``) holds the queues, both locks and the commit-retry loop,
and calls these under them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from outbox.core.errors import ConcurrencyError, TombstoneNotSentError
from outbox.core.model import DocumentRow
from outbox.delta import schema as S


@dataclass(frozen=True, slots=True)
class DocumentWrite:
    """One document to save: its new content and the version it was read at (0 = new)."""

    row: DocumentRow
    expected_version: int
    read_at: int  # table version of the snapshot the expected version was observed in
    #: ``row.state`` already encoded (compact, key-sorted JSON), so the save does not encode it
    #: again; None: the store encodes it.
    state_json: str | None = None


@dataclass(slots=True)
class Ticket:
    """One unit of work waiting to be committed, possibly together with others."""

    writes: list[DocumentWrite] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    incarnations: dict[str, str | None] | None = None
    done: bool = False
    version: int | None = None
    error: BaseException | None = None


class PendingWatermarks(Protocol):
    """Watermarks accepted by the transport but not yet written (``WatermarkWriter``): a read
    flushes them first (so a read in this process sees every mark it earned), and a save takes
    them into its own MERGE and settles them once that commit landed or failed."""

    def flush(self) -> object: ...

    def take(self, exclude: Iterable[str] = ()) -> Any: ...

    def settle(self, batch: Any, error: BaseException | None, *, carried: bool = False) -> None: ...


def finish(
    tickets: Iterable[Ticket],
    *,
    version: int | None = None,
    error: BaseException | None = None,
    cause: BaseException | None = None,
) -> None:
    for t in tickets:
        if error is not None and cause is not None and cause is not error:
            error.__cause__ = cause
        t.version, t.error, t.done = version, error, True


def take_batch(queue: list[Ticket], *, group: bool, max_documents: int) -> list[Ticket]:
    """Take from ``queue`` (in place; the caller holds its lock) the tickets of the next commit,
    in order, skipping any that touch a document already in the batch. ``group`` False: one."""
    if not group:
        first, queue[:1] = queue[:1], []
        return first
    batch: list[Ticket] = []
    seen: set[str] = set()
    rest: list[Ticket] = []
    docs = 0
    for t in queue:
        t_ids = {w.row.id for w in t.writes}
        if t_ids & seen or (batch and docs + len(t_ids) > max_documents):
            rest.append(t)
            continue
        batch.append(t)
        seen |= t_ids
        docs += len(t_ids)
    queue[:] = rest
    return batch


def recheck(
    tickets: list[Ticket], current: Mapping[str, Mapping[str, Any]], version_now: int
) -> list[Ticket]:
    """The tickets still current against ``current`` (id -> control columns read at table
    version ``version_now``), refreshed to it. A ticket with a stale document fails with
    ``ConcurrencyError`` (nothing of it is written)."""
    live: list[Ticket] = []
    for t in tickets:
        fresh: list[DocumentWrite] = []
        for w in t.writes:
            found = current.get(w.row.id)
            have = int(found["version"]) if found else 0
            if found is not None and found.get(S.DELETED):  # a tombstone: the id is free...
                if w.expected_version:  # ...but not to update: it was deleted since read
                    t.error, t.done = stale(w, have, deleted=True), True
                    break
                if int(found["last_seq"]) > int(found["dispatched_seq"]):
                    t.error, t.done = unsent_tombstone(w.row.id), True
                    break
                # A create: a new life continues the numbering ("the highest version is the
                # newest" holds), and the tombstone's rows are superseded, not in its way.
                w.row.version = have + 1
                fresh.append(DocumentWrite(w.row, 0, version_now, w.state_json))
                continue
            if w.expected_version == 0 and found is None:
                w.row.version = 1  # not a tombstone's + 1 when the fold removed it meanwhile
            reborn = (  # a create names a new life: only an update can find its own gone
                found is not None
                and w.expected_version > 0
                and found[S.INCARNATION] != w.row.incarnation
            )
            if have != w.expected_version or reborn:
                t.error, t.done = stale(w, have, reborn=reborn), True
                break
            row = w.row
            if found and int(found["dispatched_seq"]) > row.dispatched_seq:
                # The dispatcher moved the watermark since we read: drop what it sent.
                row.dispatched_seq = int(found["dispatched_seq"])
                row.outbox = [m for m in row.outbox if m.seq > row.dispatched_seq]
            fresh.append(DocumentWrite(row, w.expected_version, version_now, w.state_json))
        else:
            t.writes = fresh
            live.append(t)
    return live


def coalesce_marks(tickets: Iterable[Ticket]) -> dict[str, tuple[int, bool, str | None]]:
    """Every queued watermark as one: id -> (seq, incarnation checked, incarnation). The highest
    seq per document's life wins; a later ticket naming another life replaces it."""
    merged: dict[str, tuple[int, bool, str | None]] = {}
    for t in tickets:
        for doc_id, seq in t.marks.items():
            checked = t.incarnations is not None
            life = t.incarnations.get(doc_id) if t.incarnations is not None else None
            held = merged.get(doc_id)
            if held is None or (held[1], held[2]) != (checked, life) or held[0] < seq:
                merged[doc_id] = (seq, checked, life)  # a later ticket's life wins
    return merged


def unsent_tombstone(doc_id: str) -> TombstoneNotSentError:
    """A create over a tombstone whose last messages are not sent: the new life's newer row
    would hide the old life's pending tail from every reader and the rescuer (a loss)."""
    return TombstoneNotSentError(
        f"document {doc_id!r} was deleted and its last messages are not sent yet; nothing "
        "was written",
        hint="retry the unit of work shortly: the dispatcher sends them, then the id is free",
    )


def stale(
    w: DocumentWrite, found: int | None, *, reborn: bool = False, deleted: bool = False
) -> ConcurrencyError:
    if w.expected_version == 0 and not reborn:  # a create: the id is taken, nothing was "read"
        return ConcurrencyError(
            f"document {w.row.id!r} already exists; nothing was written",
            hint=f"change it through uow.get({w.row.id!r}), or create it under a new id",
        )
    what = "already exists" if w.expected_version == 0 else "was changed"
    if reborn and w.expected_version:
        what = "was deleted and created again"
    if deleted:
        what = "was deleted"
    seen = "" if found is None else f", found {found}"
    return ConcurrencyError(
        f"document {w.row.id!r} {what} since it was read (expected version "
        f"{w.expected_version}{seen}); nothing was written",
        hint="reload the document and apply the change again",
    )

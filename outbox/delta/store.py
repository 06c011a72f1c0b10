"""The Delta document store: reads, optimistic saves and watermarks, all as appends.

Why it looks the way it does (see docs/delta.md for the measurements):

* A save appends each document's new version, and a watermark appends a mark row
  (``outbox.delta.appends`` has both and why an append keeps every rule of an optimistic save;
  ``outbox.delta.versions`` the rule every reader folds the rows with). Nothing already in the
  table is rewritten, so a commit's cost follows the documents it changes, not the table's size.
* A save runs against the snapshot its documents were read at. If the table moved since, the
  versions are re-checked on the fresh snapshot first, so a multi-document unit of work is all or
  nothing: a stale document raises ``ConcurrencyError`` before anything is written. From that
  snapshot on, a conflicting commit (another save of one of its documents, or any commit that
  removed data) makes our append fail with ``CommitFailedError``, which we retry on a refreshed
  table (a stale handle can never succeed).
* Saves never raise a saved document's ``dispatched_seq`` beyond what they read; only
  watermarks do, and a watermark never conflicts with a save, so the dispatcher never fails an
  application's save (invariant I4). Watermarks come from ``advance_watermarks`` or ride along in
  a save's append as mark rows for *other* documents (``attach_watermarks``).
* ``incarnation`` is written with a document's first version and copied to the next ones; a
  save requires the incarnation it read, so a stale save cannot write over a document deleted and
  re-created since (it restarts at version 1).

Why one module: ``DeltaDocumentStore`` owns the two coalescing queues (group-committed saves
and watermark appends) that share one table handle, both locks and the commit-retry loops.
Everything that takes a lock is here, so one lock's invariants are read in one file. The
lock-free parts live by role: ``handle`` (the deltalake handle and when to refresh or reopen it),
``seen`` (what reads found at a version), ``table`` (open, validate, create, driver errors),
``reads`` (SQL over a snapshot, chunked id reads), ``group_commit`` (tickets, batches, the
re-check, coalesced marks) and ``appends`` (the rows a commit appends). Their public names stay
importable from here.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from outbox.core import telemetry
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ClosedError, CommitConflictError, StoreError
from outbox.core.model import DocumentRow, bucket_of
from outbox.delta import appends, group_commit, reads, versions
from outbox.delta import schema as S
from outbox.delta.file_ids import FileIds
from outbox.delta.group_commit import (
    DocumentWrite,
    PendingWatermarks,
    Ticket,
    coalesce_marks,
    finish,
    take_batch,
)
from outbox.delta.handle import TableHandle
from outbox.delta.reads import quote_ids
from outbox.delta.seen import SeenReads
from outbox.delta.table import (
    DEFAULT_BUCKETS,
    TableInfo,
    commit_failed,
    create_table,
    local_log_dir,
    store_error,
    validate,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "SCAN_CHUNK",
    "DeltaDocumentStore",
    "DocumentWrite",
    "PendingWatermarks",
    "TableInfo",
    "quote_ids",
]

log = logging.getLogger("outbox.store")

#: Ids per read query (``outbox.delta.reads.scan`` says why). Read by ``_scan`` at each call, so
#: a test may patch it here.
SCAN_CHUNK = 5_000


class DeltaDocumentStore:
    """Documents in one Delta table. Thread-safe: one handle, one lock, refreshed before writes."""

    def __init__(
        self,
        uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        max_commit_retries: int = 10,
        retry_base_seconds: float = 0.01,
        group_commit: bool = True,
        max_group_documents: int = 1000,
    ) -> None:
        self.uri = uri
        self._storage_options = dict(storage_options or {})
        self._clock = clock or SystemClock()
        self._max_retries = max_commit_retries
        self._retry_base = retry_base_seconds
        self._lock = threading.RLock()
        self._queue_lock = threading.Lock()
        self._queue: list[Ticket] = []
        self.group_commit = group_commit
        self.max_group_documents = max_group_documents
        self.group_commits = 0  # commits that carried more than one unit of work
        self.grouped_units = 0
        self._mark_queue: list[Ticket] = []
        self.watermark_groups = 0  # watermark MERGEs that carried more than one dispatch
        self._closed = False
        self.commit_retries = 0  # observed CommitFailedError retries, for metrics and benchmarks
        # This process's unwritten watermarks (``attach_watermarks``): flushed before ``read``
        # and ``scan_pending``, carried by the next save's MERGE.
        self._pending: PendingWatermarks | None = None
        self._carried: Any = None  # the batch the append being built carries
        # What reads found at one table version, so a save needs no re-check.
        self._seen = SeenReads()
        self._file_ids = FileIds(self._storage_options)  # a read of new ids: unseen files only
        self._handle = TableHandle(uri, self._storage_options)
        self._log_dir = local_log_dir(uri)
        self.info = self._validate()

    # --- opening and validation ------------------------------------------------------------

    @property
    def _dt(self) -> Any:
        """The current deltalake handle (``outbox.delta.handle`` keeps it fresh and cheap)."""
        return self._handle.table

    def _validate(self) -> TableInfo:
        return validate(self._dt, self.uri)

    @classmethod
    def create(
        cls,
        uri: str,
        *,
        buckets: int = DEFAULT_BUCKETS,
        storage_options: Mapping[str, str] | None = None,
        table_id: str | None = None,
    ) -> bool:
        """Create the table if it is missing. Returns True when it was created."""
        return create_table(
            uri, buckets=buckets, storage_options=storage_options, table_id=table_id
        )

    # --- plumbing ---------------------------------------------------------------------------

    @property
    def table_id(self) -> str:
        return self.info.table_id

    @property
    def buckets(self) -> int:
        return self.info.buckets

    @property
    def delta_table(self) -> Any:
        """The underlying ``deltalake.DeltaTable`` (for maintenance and the rescuer)."""
        return self._dt

    def bucket(self, doc_id: str) -> int:
        return bucket_of(doc_id, self.info.buckets)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(
                "the document store is closed", hint="open a new Outbox with Outbox.open(...)"
            )

    def close(self) -> None:
        self._closed = True

    def refresh(self) -> int:
        """Bring the handle to the newest version (0.2 ms when nothing changed)."""
        with self._lock:
            self._check_open()
            self._update()
            return int(self._dt.version())

    def version(self) -> int:
        return int(self._dt.version())

    def attach_watermarks(self, pending: PendingWatermarks) -> None:
        """Attach this process's unwritten watermarks (the dispatcher's ``WatermarkWriter``):
        from now on a read flushes them first, and a save carries them in its MERGE."""
        self._pending = pending

    def detach_watermarks(self, pending: PendingWatermarks | None = None) -> None:
        """Detach ``pending`` (whatever is attached, when None); a read or a save no longer
        involves it."""
        if pending is None or self._pending is pending:
            self._pending = None

    def _barrier(self) -> None:
        pending = self._pending
        if pending is not None:
            pending.flush()

    def _backoff(self, attempt: int) -> None:
        self.commit_retries += 1
        telemetry.instrument(
            "counter", "outbox.conflict_retries", "{retry}", "Delta commit conflicts retried"
        ).add(1)
        delay = self._retry_base * (2 ** min(attempt, 6)) * (0.5 + random.random())
        self._clock.sleep(delay)

    # --- reads ------------------------------------------------------------------------------

    def _query(self, sql: str) -> pa.Table:
        """Run SQL over the current snapshot (``outbox.delta.reads.query``)."""
        return reads.query(self._dt, sql, self.uri)

    def _update(self) -> None:
        """Refresh the handle if the table moved, with driver errors translated."""
        self._handle.update()

    def _scan(self, ids: Sequence[str], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``ids`` some data file may hold (``outbox.delta.file_ids``), by SQL."""
        present = self._file_ids.maybe_present(self._dt, ids, self.bucket)
        wanted = ids if present is None else present
        return reads.scan(self._query, wanted, columns, self.bucket, SCAN_CHUNK)

    def read(
        self, ids: Sequence[str], *, barrier: bool = True
    ) -> tuple[int, dict[str, DocumentRow]]:
        """Current rows for ``ids`` (absent ones are missing) and the version they were read at.
        A tombstone (``deleted``) is a row too: the dispatcher sends its last messages.

        ``barrier=False`` (a unit of work's read) skips the flush of unwritten watermarks: a
        save that keeps an already-sent message is harmless (the dispatcher skips what a waiting
        mark covers), and the read stays off the watermark's cost.
        """
        if barrier:
            self._barrier()
        with self._lock:
            self._check_open()
            self._update()
            if not ids:
                return int(self._dt.version()), {}
            scanned = self._scan(ids)
            rows = S.rows_from_table(versions.latest_rows(scanned, include_deleted=True))
            version = int(self._dt.version())
            damaged = versions.duplicated(scanned)  # a save of one re-checks, and is refused
            self._seen.remember(version, [i for i in ids if i not in damaged], rows)
            return version, {r.id: r for r in rows}

    def scan_pending(self, columns: list[str] | None = None) -> pa.Table:
        """Full sweep: documents whose ``last_seq > dispatched_seq`` (control columns by
        default), each as its latest version with the folded watermark (``versions``)."""
        self._barrier()
        with self._lock:
            self._check_open()
            self._update()
            return self._query(versions.pending_sql(columns or S.CONTROL_COLUMNS))

    # --- writes -----------------------------------------------------------------------------

    def save(self, writes: Sequence[DocumentWrite]) -> int:
        """Commit every write in one Delta commit, or raise and write nothing. Returns the version.

        Group commit: while one thread commits, others queue their units of work; the next
        thread to get the lock commits every queued unit of work (with disjoint documents) in one
        MERGE. Each unit of work still succeeds or fails on its own: a stale one is dropped from
        the group with ``ConcurrencyError`` before the MERGE, and the rest commit together.
        """
        if not writes:
            return self.version()
        ids = [w.row.id for w in writes]
        if len(set(ids)) != len(ids):
            raise StoreError("a save names the same document twice; merge the changes first")
        self._check_open()
        ticket = Ticket(writes=list(writes))
        with self._queue_lock:
            self._queue.append(ticket)
        self._await(ticket, self._lead_saves)
        assert ticket.version is not None
        return ticket.version

    def _lead_saves(self) -> None:
        """Commit what is queued; any failure finishes every ticket of the batch (no waiter is
        left behind, whatever raised: a refresh, the re-check read or the MERGE)."""
        batch = self._take_batch()
        if not batch:
            return
        try:
            self._commit_tickets(batch)
        except Exception as e:
            finish(
                [t for t in batch if not t.done],
                error=store_error(f"saving to {self.uri} failed", e),
                cause=e,
            )

    def _await(self, ticket: Ticket, lead: Callable[[], None]) -> None:
        """Leader/follower: whoever holds the lock commits what is queued, others' work too."""
        while not ticket.done:
            with self._lock:
                if ticket.done:
                    break
                self._check_open()
                lead()
        if ticket.error is not None:
            raise ticket.error

    def _take_batch(self) -> list[Ticket]:
        """Queued tickets in order, skipping any that touch a document already in the batch."""
        with self._queue_lock:
            return take_batch(
                self._queue, group=self.group_commit, max_documents=self.max_group_documents
            )

    def _commit_tickets(self, tickets: list[Ticket]) -> None:
        """The save's commit, carrying the unwritten watermarks (``attach_watermarks``) when there
        are any: a stream of units of work then pays no watermark commit of its own. A mark only
        raises ``dispatched_seq`` (``greatest``) of the life it names, never of a document this
        save writes (its mark waits for the next write), so the save's own rules are unchanged;
        if the save fails, the marks go back and wait."""
        source = self._pending
        batch = None
        if source is not None:
            batch = source.take(exclude=[w.row.id for t in tickets for w in t.writes])
        self._carried = batch
        error: BaseException | None = None
        try:
            self._commit_tickets_once(tickets)
        except BaseException as e:
            error = e
            raise
        finally:
            self._carried = None
            if source is not None and batch is not None:
                landed = error is None and all(t.error is None for t in tickets)
                source.settle(
                    batch, None if landed else (error or StoreError("save failed")), carried=True
                )

    def _commit_tickets_once(self, tickets: list[Ticket]) -> None:
        live = tickets
        for attempt in range(self._max_retries + 1):
            self._update()
            current = int(self._dt.version())
            writes = [w for t in live for w in t.writes]
            # Re-check unless this store read every document at this very snapshot, as the write
            # expects it (a create that never read its id, a table that moved, a caller's own
            # ``read_at``): several documents must not be half-saved because one is stale, a
            # moved watermark must not send already-sent messages again, and an append has no
            # predicate of its own. From this snapshot on, the append's conflicts are the check.
            claimed = all(w.read_at == current for w in writes)
            if attempt > 0 or not (claimed and self._seen.covers(writes, current)):
                live = self._recheck(live)
                if not live:
                    return
                writes = [w for t in live for w in t.writes]
            try:
                self._append_documents(writes, current)
            except Exception as e:
                if commit_failed(e):
                    log.debug("save conflicted (attempt %d): %s", attempt + 1, e)
                    if attempt < self._max_retries:
                        self._backoff(attempt)
                    continue
                finish(live, error=store_error(f"saving to {self.uri} failed", e), cause=e)
                return
            if len(live) > 1:
                self.group_commits += 1
                self.grouped_units += len(live)
            finish(live, version=int(self._dt.version()))
            return
        finish(
            live,
            error=CommitConflictError(
                f"saving {sum(len(t.writes) for t in live)} document(s) to {self.uri} kept "
                f"conflicting with concurrent writers after {self._max_retries} retries",
                hint="retry the unit of work; if it persists, look for a writer that deletes or "
                "rewrites documents in a loop",
            ),
        )

    def _append_documents(self, writes: Sequence[DocumentWrite], current: int) -> None:
        """One append on ``current``: each document's new version (with its transaction), the
        carried watermarks' mark rows (``_carried``); the file id index notes what it wrote."""
        rows = appends.document_rows(writes, self.bucket)
        carried = self._carried
        if carried is not None and carried.marks:
            marks = appends.mark_rows(carried.marks, self.bucket, self._clock.now())
            rows = pa.concat_tables([rows, marks])
        appends.append(
            self._dt,
            rows,
            operation="save",
            documents=[(w.row.id, w.row.version) for w in writes],
        )
        self._file_ids.wrote(self._dt, rows.column("id").to_pylist(), self.bucket, current)

    def _recheck(self, tickets: list[Ticket]) -> list[Ticket]:
        """Re-read versions at the current snapshot. A ticket with a stale document fails with
        ``ConcurrencyError`` (nothing of it is written); the others go on, refreshed."""
        ids = [w.row.id for t in tickets for w in t.writes]
        scanned = self._scan(ids, S.RECHECK_COLUMNS)
        damaged = versions.duplicated(scanned)
        if damaged:
            tickets = self._refuse_damaged(tickets, damaged)
        rows = versions.latest_rows(scanned, include_deleted=True)
        current = {r["id"]: r for r in rows.to_pylist()}
        # looked up at each call, so a test can patch it (tests/test_mutations.py)
        return group_commit.recheck(tickets, current, int(self._dt.version()))

    def _refuse_damaged(self, tickets: list[Ticket], damaged: dict[str, int]) -> list[Ticket]:
        """Fail the tickets that save a document whose version is held by two rows."""
        live = []
        for t in tickets:
            hit = next((w.row.id for w in t.writes if w.row.id in damaged), None)
            if hit is None:
                live.append(t)
            else:
                t.error, t.done = versions.damage_error(self.uri, hit, damaged[hit]), True
        return live

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None:
        """Raise ``dispatched_seq`` to at least ``marks[id]`` for every id, in one append of mark
        rows (``outbox.delta.appends``).

        Never lowers a watermark (the versions rule reads the highest) and never checks the
        document version, so it cannot fail a concurrent save, nor conflict with one.
        Watermarks queued by other threads meanwhile ride along in the same append. With
        ``incarnations``, a mark applies only to the document's life it names: a document
        deleted and created again since its messages were sent restarts at seq 1, and its
        predecessor's mark must not cover the new life's messages (a loss). Without, each mark
        takes the life the document has when the mark is written (a missing document's mark is
        dropped). Returns the new table version, or None when nothing was written.
        """
        if not marks:
            return None
        self._check_open()
        ticket = Ticket(
            marks={i: int(seq) for i, seq in marks.items()},
            incarnations=None if incarnations is None else {i: incarnations[i] for i in marks},
        )
        with self._queue_lock:
            self._mark_queue.append(ticket)
        self._await(ticket, self._commit_marks)
        return ticket.version

    def _commit_marks(self) -> None:
        with self._queue_lock:
            tickets = list(self._mark_queue)
            self._mark_queue.clear()
        merged = coalesce_marks(tickets)
        try:
            version = self._append_marks(merged)
        except Exception as e:
            finish(tickets, error=store_error(f"advancing watermarks in {self.uri} failed", e))
            return
        if len(tickets) > 1:
            self.watermark_groups += 1
        finish(tickets, version=version)

    def _append_marks(self, marks: Mapping[str, tuple[int, bool, str | None]]) -> int | None:
        lives = {i: life for i, (_, checked, life) in marks.items() if checked}
        unchecked = [i for i, m in marks.items() if not m[1]]
        if unchecked:  # stamp each with the document's life now; a missing document has none
            self._update()
            now = versions.latest_rows(self._scan(unchecked, S.RECHECK_COLUMNS))
            lives |= {r["id"]: r[S.INCARNATION] for r in now.to_pylist()}
        rows = {i: (marks[i][0], life) for i, life in lives.items()}
        if not rows:
            return None
        attempts = self._max_retries * 3 + 1  # a watermark must land: it has no version check
        for attempt in range(attempts):
            self._update()
            before = int(self._dt.version())
            try:
                appends.append(
                    self._dt,
                    appends.mark_rows(rows, self.bucket, self._clock.now()),
                    operation="watermark",
                )
                self._file_ids.wrote(self._dt, list(rows), self.bucket, before)
            except Exception as e:
                if commit_failed(e):  # an append conflicts only with a metadata change
                    if attempt < attempts - 1:
                        self._backoff(attempt)
                    continue
                raise store_error(f"advancing watermarks in {self.uri} failed", e) from e
            return int(self._dt.version())
        raise CommitConflictError(
            f"advancing watermarks in {self.uri} kept conflicting with concurrent writers",
            hint="the rescuer will finish the job; look for a writer changing the table's "
            "metadata in a loop",
        )

"""The Delta document store: reads, optimistic saves and watermark updates, all through MERGE.

Why it looks the way it does (see docs/delta.md for the measurements):

* Every MERGE carries a *literal* ``t.bucket IN (...)`` filter, so writers on different buckets
  commit side by side (``outbox.delta.merge`` has the statements and their rules).
* A save runs against the snapshot its documents were read at. If the table moved since, the
  versions are re-checked on the fresh snapshot first, so a multi-document unit of work is all or
  nothing: a stale document raises ``ConcurrencyError`` before anything is written, and a writer
  that commits after our snapshot makes our commit fail with ``CommitFailedError``, which we retry
  on a refreshed table (a stale handle can never succeed).
* Saves never write a saved document's ``dispatched_seq``; only watermarks do, with
  ``greatest(...)`` and no version check, so the dispatcher never fails an application's save
  (invariant I4). Watermarks come from ``advance_watermarks`` or ride along in a save's MERGE as
  extra source rows for *other* documents (``attach_watermarks``), the same update either way.
* ``incarnation`` is written by the insert branch only: updates and watermarks never touch it.
  An update also requires the incarnation it read, so a stale save cannot overwrite a document
  deleted and re-created since (it restarts at version 1).

Why one module: ``DeltaDocumentStore`` owns one table handle, the rule for when to refresh it, the
two coalescing queues (group-committed saves and watermark MERGEs) that share that handle, both
locks and the commit-retry loops. Everything that takes a lock is here, so one lock's invariants
are read in one file. The lock-free parts live by role: ``table`` (open, validate, create, driver
errors), ``reads`` (SQL over a snapshot, chunked id reads), ``group_commit`` (tickets, batches, the
re-check, coalesced marks) and ``merge`` (the two MERGE statements). Their public names stay
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
from outbox.delta import merge, reads
from outbox.delta import schema as S
from outbox.delta.group_commit import (
    DocumentWrite,
    PendingWatermarks,
    Ticket,
    coalesce_marks,
    finish,
    recheck,
    stale,
    take_batch,
)
from outbox.delta.reads import quote_ids
from outbox.delta.table import (
    DEFAULT_BUCKETS,
    TableInfo,
    commit_failed,
    create_table,
    deltalake,
    local_log_dir,
    open_table,
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
        self._carried: Any = None  # the batch the MERGE being built carries
        self._merge_counts = (0, 0)  # (inserted, updated) of the last save MERGE
        self._dt = self._open()
        self._log_dir = local_log_dir(uri)
        self.info = self._validate()

    # --- opening and validation ------------------------------------------------------------

    def _open(self) -> Any:
        return open_table(self.uri, self._storage_options)

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
        """Refresh the handle if the table moved, with driver errors translated.

        Why the stat first: in deltalake 1.6.6 ``update_incremental`` is not incremental (it
        replays the log from the last checkpoint, delta-rs issue #4276), so even a refresh that
        finds nothing new costs 10-16 ms once a table has ~5,000 commits, and more as tombstones
        pile up in the checkpoints. A commit is an atomic put of ``<version + 1>.json``; when that
        file does not exist the handle is current, and a local stat answers in microseconds.
        """
        version = int(self._dt.version())
        if self._log_dir is not None:
            following = self._log_dir / f"{version + 1:020d}.json"
            # Both stats: the log trim (outbox.delta.log) may have deleted the commits after an
            # idle handle's version, and then the absence of the next one proves nothing.
            if not following.exists() and (self._log_dir / f"{version:020d}.json").exists():
                return
        dl = deltalake()
        try:
            self._dt.update_incremental()
        except (OSError, dl.exceptions.DeltaError) as e:
            if "invalid table version" not in str(e).lower():
                raise store_error(f"refreshing {self.uri} failed", e) from e
            # The log was trimmed past this handle's version: open the table afresh (it loads
            # from the newest checkpoint, which the trim always keeps).
            log.info("the handle's version %d was trimmed from the log; reopening", version)
            self._dt = self._open()

    def _scan(self, ids: Sequence[str], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``ids``, ``SCAN_CHUNK`` ids per query (``outbox.delta.reads.scan``)."""
        return reads.scan(self._query, ids, columns, self.bucket, SCAN_CHUNK)

    def read(
        self, ids: Sequence[str], *, barrier: bool = True
    ) -> tuple[int, dict[str, DocumentRow]]:
        """Current rows for ``ids`` (absent ones are missing) and the version they were read at.

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
            rows = S.rows_from_table(self._scan(ids))
            return int(self._dt.version()), {r.id: r for r in rows}

    def scan_pending(self, columns: list[str] | None = None) -> pa.Table:
        """Full sweep: rows whose ``last_seq > dispatched_seq`` (control columns by default)."""
        self._barrier()
        with self._lock:
            self._check_open()
            self._update()
            cols = ", ".join(columns or S.CONTROL_COLUMNS)
            return self._query(f"SELECT {cols} FROM t WHERE last_seq > dispatched_seq")

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
            # Re-check when the table moved since the documents were read: several documents
            # must not be half-saved because one is stale, and a moved watermark must not send
            # already-sent messages again. One new document needs none: the MERGE's own
            # predicates are the whole check (0 rows written = it exists, nothing written).
            moved = attempt > 0 or any(w.read_at != current for w in writes)
            single_create = len(writes) == 1 and writes[0].expected_version == 0
            if moved and not single_create:
                live = self._recheck(live)
                if not live:
                    return
                writes = [w for t in live for w in t.writes]
            try:
                written = self._merge_documents(writes)
            except Exception as e:
                if commit_failed(e):
                    log.debug("save conflicted (attempt %d): %s", attempt + 1, e)
                    if attempt < self._max_retries:
                        self._backoff(attempt)
                    continue
                finish(live, error=store_error(f"saving to {self.uri} failed", e), cause=e)
                return
            version = int(self._dt.version())
            if self._carried is not None:
                written = merge.documents_written(
                    writes, self._merge_counts, len(self._carried.marks)
                )
            if written == 0 and len(writes) == 1:
                finish(live, error=stale(writes[0], None))
                return
            if written != len(writes):  # pragma: no cover - guarded by the snapshot re-check
                finish(
                    live,
                    error=StoreError(
                        f"save wrote {written} of {len(writes)} documents at version {version}; "
                        "report this as a bug"
                    ),
                )
                return
            if len(live) > 1:
                self.group_commits += 1
                self.grouped_units += len(live)
            finish(live, version=version)
            return
        finish(
            live,
            error=CommitConflictError(
                f"saving {sum(len(t.writes) for t in live)} document(s) to {self.uri} kept "
                f"conflicting with concurrent writers after {self._max_retries} retries",
                hint="retry the unit of work; if it persists, spread writers over more buckets",
            ),
        )

    def _merge_documents(self, writes: Sequence[DocumentWrite]) -> int:
        """One save MERGE (``outbox.delta.merge.save_merge``), raising the watermarks this save
        carries (``_carried``); the rows it wrote."""
        carried = self._carried
        marks = None if carried is None else carried.marks
        self._merge_counts = merge.save_merge(self._dt, writes, self.bucket, marks)
        return sum(self._merge_counts)

    def _recheck(self, tickets: list[Ticket]) -> list[Ticket]:
        """Re-read versions at the current snapshot. A ticket with a stale document fails with
        ``ConcurrencyError`` (nothing of it is written); the others go on, refreshed."""
        ids = [w.row.id for t in tickets for w in t.writes]
        current = {r["id"]: r for r in self._scan(ids, S.CONTROL_COLUMNS).to_pylist()}
        return recheck(tickets, current, int(self._dt.version()))

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None:
        """Raise ``dispatched_seq`` to at least ``marks[id]`` for every id, in one MERGE.

        Never lowers a watermark and never checks the document version, so it cannot fail a
        concurrent save; a commit conflict is simply retried on a refreshed table. Watermarks
        queued by other threads meanwhile ride along in the same MERGE (each dispatch would
        otherwise cost a Delta commit of its own). With ``incarnations``, a mark only applies to
        the document's life it names (``IS NOT DISTINCT FROM``: a legacy null matches a null): a
        document deleted and created again since its messages were sent restarts at seq 1, and
        its predecessor's mark must not cover the new life's messages (a loss). Returns the new
        table version, or None when nothing needed to change.
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
            version = self._merge_watermarks(merged)
        except Exception as e:
            finish(tickets, error=store_error(f"advancing watermarks in {self.uri} failed", e))
            return
        if len(tickets) > 1:
            self.watermark_groups += 1
        finish(tickets, version=version)

    def _merge_watermarks(self, marks: Mapping[str, tuple[int, bool, str | None]]) -> int | None:
        source, buckets = merge.watermark_source(marks, self.bucket)
        attempts = self._max_retries * 3 + 1  # a watermark must land: it has no version check
        for attempt in range(attempts):
            self._update()
            try:
                updated = merge.watermark_merge(self._dt, source, buckets)
            except Exception as e:
                if commit_failed(e):
                    if attempt < attempts - 1:
                        self._backoff(attempt)
                    continue
                raise store_error(f"advancing watermarks in {self.uri} failed", e) from e
            if updated == 0:
                return None
            return int(self._dt.version())
        raise CommitConflictError(
            f"advancing watermarks in {self.uri} kept conflicting with concurrent writers",
            hint="the rescuer will finish the job; check for a hot bucket",
        )

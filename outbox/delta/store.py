"""The Delta document store: reads, optimistic saves and watermark updates, all through MERGE.

Why it looks the way it does (see docs/delta.md for the measurements):

* Every MERGE carries a *literal* ``t.bucket IN (...)`` filter. delta-rs fails one of any two
  overlapping MERGEs on an unpartitioned table; with bucket partitions and a literal filter,
  writers on different buckets commit side by side.
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
  An update also requires the incarnation it read (``IS NOT DISTINCT FROM``, so a legacy null
  matches a null): a document deleted and re-created since the read restarts at version 1, and
  a version check alone would let a stale save overwrite the new document.

Why one module: ``DeltaDocumentStore`` owns one table handle, the rule for when to refresh it,
and the two coalescing queues (group-committed saves and watermark MERGEs) that share that
handle, its lock and its commit-retry loop. Split across files, one lock's invariants would have
to be read in several places; the pure helpers at the bottom are small.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from outbox.core import telemetry
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import (
    ChangeDataFeedDisabledError,
    ClosedError,
    CommitConflictError,
    ConcurrencyError,
    SchemaMismatchError,
    StoreError,
    TableNotFoundError,
)
from outbox.core.model import DocumentRow, bucket_of
from outbox.delta import schema as S

log = logging.getLogger("outbox.store")

DEFAULT_BUCKETS = 16


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
class _Ticket:
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


def _finish(
    tickets: Iterable[_Ticket],
    *,
    version: int | None = None,
    error: BaseException | None = None,
    cause: BaseException | None = None,
) -> None:
    for t in tickets:
        if error is not None and cause is not None and cause is not error:
            error.__cause__ = cause
        t.version, t.error, t.done = version, error, True


@dataclass(frozen=True, slots=True)
class TableInfo:
    uri: str
    table_id: str
    buckets: int
    schema_version: int
    version: int


def _deltalake() -> Any:
    import deltalake

    return deltalake


def _commit_failed(e: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(e, CommitFailedError)


#: Ids per read query (see ``DeltaDocumentStore._scan``).
SCAN_CHUNK = 5_000


def _in_list(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in sorted(set(values)))


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


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
        self._queue: list[_Ticket] = []
        self.group_commit = group_commit
        self.max_group_documents = max_group_documents
        self.group_commits = 0  # commits that carried more than one unit of work
        self.grouped_units = 0
        self._mark_queue: list[_Ticket] = []
        self.watermark_groups = 0  # watermark MERGEs that carried more than one dispatch
        self._closed = False
        self.commit_retries = 0  # observed CommitFailedError retries, for metrics and benchmarks
        # This process's unwritten watermarks (``attach_watermarks``): flushed before ``read``
        # and ``scan_pending``, carried by the next save's MERGE.
        self._pending: PendingWatermarks | None = None
        self._carried: Any = None  # the batch the MERGE being built carries
        self._merge_counts = (0, 0)  # (inserted, updated) of the last save MERGE
        self._dt = self._open()
        self._log_dir = _local_log_dir(uri)
        self.info = self._validate()

    # --- opening and validation ------------------------------------------------------------

    def _open(self) -> Any:
        dl = _deltalake()
        from deltalake.exceptions import DeltaError as DlDeltaError
        from deltalake.exceptions import TableNotFoundError as DlNotFound

        try:
            return dl.DeltaTable(self.uri, storage_options=self._storage_options or None)
        except DlNotFound as e:
            raise TableNotFoundError(
                f"no Delta table at {self.uri}", hint="run `outbox migrate` to create it"
            ) from e
        except OSError as e:
            raise TableNotFoundError(f"cannot open the Delta table at {self.uri}: {e}") from e
        except DlDeltaError as e:  # a damaged log: one line, not a kernel traceback
            raise _unreadable_log(self.uri, e) from e

    def _validate(self) -> TableInfo:
        meta = self._dt.metadata()
        config: dict[str, str] = dict(meta.configuration or {})
        if config.get(S.CDF_PROPERTY, "").lower() != "true":
            raise ChangeDataFeedDisabledError(
                f"the table at {self.uri} does not have the change data feed enabled",
                hint="run `outbox migrate` (or ALTER TABLE ... SET TBLPROPERTIES "
                "(delta.enableChangeDataFeed = true))",
            )
        mismatch = S.describe_mismatch(pa.schema(self._dt.schema().to_arrow()))
        if mismatch:
            raise SchemaMismatchError(
                f"the table at {self.uri} is not an outbox document table: {mismatch}",
                hint="point the workspace at an outbox table, or migrate a new path",
            )
        if list(meta.partition_columns) != ["bucket"]:
            raise SchemaMismatchError(
                f"the table at {self.uri} is partitioned by {list(meta.partition_columns)}, "
                "expected ['bucket']",
                hint="recreate it with `outbox migrate` on a new path",
            )
        if S.is_legacy(pa.schema(self._dt.schema().to_arrow())):
            raise SchemaMismatchError(
                f"the table at {self.uri} predates document incarnations (no "
                f"{S.INCARNATION!r} column)",
                hint="run `outbox migrate` to upgrade it: it adds the column, and existing rows "
                "keep their message ids",
            )
        outbox_meta = S.parse_description(meta.description)
        try:
            buckets = int(outbox_meta[S.BUCKETS_KEY])
            table_id = str(outbox_meta[S.TABLE_ID_KEY])
            schema_version = int(outbox_meta.get(S.SCHEMA_VERSION_KEY, 0))
        except (KeyError, ValueError, TypeError) as e:
            raise SchemaMismatchError(
                f"the table at {self.uri} lacks the outbox metadata in its description ({e})",
                hint="run `outbox migrate` to record them",
            ) from e
        if schema_version > S.SCHEMA_VERSION:
            raise SchemaMismatchError(
                f"the table at {self.uri} has outbox schema version {schema_version}; this "
                f"version of delta-outbox understands up to {S.SCHEMA_VERSION}",
                hint="upgrade delta-outbox",
            )
        return TableInfo(self.uri, table_id, buckets, schema_version, self._dt.version())

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
        dl = _deltalake()
        if dl.DeltaTable.is_deltatable(uri, storage_options=dict(storage_options or {}) or None):
            return False
        dl.DeltaTable.create(
            uri,
            schema=S.DOCUMENT_SCHEMA,
            partition_by=["bucket"],
            mode="ignore",
            name="outbox_documents",
            description=S.describe_table(S.SCHEMA_VERSION, buckets, table_id or str(uuid.uuid4())),
            configuration={S.CDF_PROPERTY: "true"},
            storage_options=dict(storage_options or {}) or None,
        )
        return True

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
        """Run SQL over the current snapshot with DataFusion (registered as ``t``).

        Why not ``to_pyarrow_table(filters=...)``: in deltalake 1.6.6 it prunes partitions only
        through the deprecated ``partitions=`` argument, and once a Delta checkpoint exists its
        string statistics come back as ``string_view`` and every filter on ``id`` fails with
        "no kernel matching input types (string, string_view)". DataFusion prunes by partition
        and file statistics and reads one document in about 5 ms.
        """
        dl = _deltalake()
        try:
            reader = dl.QueryBuilder().register("t", self._dt).execute(sql)
            return _plain_strings(pa.RecordBatchReader.from_stream(reader).read_all())
        except (OSError, pa.ArrowException, dl.exceptions.DeltaError) as e:
            raise _store_error(f"reading {self.uri} failed", e) from e

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
        dl = _deltalake()
        try:
            self._dt.update_incremental()
        except (OSError, dl.exceptions.DeltaError) as e:
            if "invalid table version" not in str(e).lower():
                raise _store_error(f"refreshing {self.uri} failed", e) from e
            # The log was trimmed past this handle's version: open the table afresh (it loads
            # from the newest checkpoint, which the trim always keeps).
            log.info("the handle's version %d was trimmed from the log; reopening", version)
            self._dt = self._open()

    def _scan(self, ids: Sequence[str], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``ids``, ``SCAN_CHUNK`` ids per query.

        Why chunks: DataFusion (deltalake 1.6.6) plans ``id IN (...)`` recursively, and a list of
        100,000 literals overflowed its stack: a unit of work with 100,000 documents killed the
        process with SIGSEGV (tests/write_path/test_unit_of_work.py has the regression test).
        """
        cols = ", ".join(columns) if columns else "*"
        parts = []
        for start in range(0, max(len(ids), 1), SCAN_CHUNK):
            chunk = ids[start : start + SCAN_CHUNK]
            buckets = _in_list(self.bucket(i) for i in chunk)
            parts.append(
                self._query(
                    f"SELECT {cols} FROM t WHERE bucket IN ({buckets}) "
                    f"AND id IN ({quote_ids(chunk)})"
                )
            )
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

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
        ticket = _Ticket(writes=list(writes))
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
            _finish(
                [t for t in batch if not t.done],
                error=_store_error(f"saving to {self.uri} failed", e),
                cause=e,
            )

    def _await(self, ticket: _Ticket, lead: Callable[[], None]) -> None:
        """Leader/follower: whoever holds the lock commits what is queued, others' work too."""
        while not ticket.done:
            with self._lock:
                if ticket.done:
                    break
                self._check_open()
                lead()
        if ticket.error is not None:
            raise ticket.error

    def _take_batch(self) -> list[_Ticket]:
        """Queued tickets in order, skipping any that touch a document already in the batch."""
        with self._queue_lock:
            if not self.group_commit:
                first, self._queue[:1] = self._queue[:1], []
                return first
            batch: list[_Ticket] = []
            seen: set[str] = set()
            rest: list[_Ticket] = []
            docs = 0
            for t in self._queue:
                t_ids = {w.row.id for w in t.writes}
                if t_ids & seen or (batch and docs + len(t_ids) > self.max_group_documents):
                    rest.append(t)
                    continue
                batch.append(t)
                seen |= t_ids
                docs += len(t_ids)
            self._queue[:] = rest
            return batch

    def _commit_tickets(self, tickets: list[_Ticket]) -> None:
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

    def _commit_tickets_once(self, tickets: list[_Ticket]) -> None:
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
                if _commit_failed(e):
                    log.debug("save conflicted (attempt %d): %s", attempt + 1, e)
                    if attempt < self._max_retries:
                        self._backoff(attempt)
                    continue
                _finish(live, error=_store_error(f"saving to {self.uri} failed", e), cause=e)
                return
            version = int(self._dt.version())
            if self._carried is not None:  # the marks' updates count too: bound the documents'
                inserted, updated = self._merge_counts
                doc_updates = len(writes) - inserted
                consistent = updated - len(self._carried.marks) <= doc_updates <= updated
                written = len(writes) if consistent else inserted + updated
                if len(writes) == 1 and writes[0].expected_version == 0:
                    written = inserted  # a create only ever inserts
            if written == 0 and len(writes) == 1:
                _finish(live, error=_stale(writes[0], None))
                return
            if written != len(writes):  # pragma: no cover - guarded by the snapshot re-check
                _finish(
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
            _finish(live, version=version)
            return
        _finish(
            live,
            error=CommitConflictError(
                f"saving {sum(len(t.writes) for t in live)} document(s) to {self.uri} kept "
                f"conflicting with concurrent writers after {self._max_retries} retries",
                hint="retry the unit of work; if it persists, spread writers over more buckets",
            ),
        )

    def _merge_documents(self, writes: Sequence[DocumentWrite]) -> int:
        """One MERGE: update rows still at their expected version, insert new ones, and raise
        the watermarks this save carries (``_carried``)."""
        source = S.table_from_rows(
            ((w.row, self.bucket(w.row.id)) for w in writes),
            states=[w.state_json for w in writes],
            extra={
                "_expected": (pa.int64(), [w.expected_version for w in writes]),
                "_mark": (pa.int64(), [None] * len(writes)),
            },
        )
        carried = self._carried
        bucket_ids = [self.bucket(w.row.id) for w in writes]
        if carried is not None:
            ids = list(carried.marks)
            bucket_ids += [self.bucket(i) for i in ids]
            nullable = pa.schema([f.with_nullable(True) for f in source.schema])
            marks = _mark_rows(nullable, carried.marks, ids, [self.bucket(i) for i in ids])
            source = pa.concat_tables([source.cast(nullable), marks])
        buckets = _in_list(bucket_ids)
        merger = self._dt.merge(
            source,
            predicate=f"t.bucket IN ({buckets}) AND t.bucket = s.bucket AND t.id = s.id",
            source_alias="s",
            target_alias="t",
            streamed_exec=False,
        ).when_matched_update(
            updates={
                "type": "s.type",
                "version": "s.version",
                "state": "s.state",
                "last_seq": "s.last_seq",
                "outbox": "s.outbox",
                "updated_at": "s.updated_at",
            },
            predicate="s._mark IS NULL AND t.version = s._expected "
            f"AND t.{S.INCARNATION} IS NOT DISTINCT FROM s.{S.INCARNATION}",
        )
        if carried is not None:
            merger = merger.when_matched_update(
                updates={"dispatched_seq": "greatest(t.dispatched_seq, s._mark)"},
                predicate="s._mark IS NOT NULL AND t.dispatched_seq < s._mark "
                f"AND t.{S.INCARNATION} IS NOT DISTINCT FROM s.{S.INCARNATION}",
            )
        metrics = merger.when_not_matched_insert(
            updates={f.name: f"s.{f.name}" for f in S.DOCUMENT_SCHEMA},
            predicate="s._mark IS NULL AND s._expected = 0",
        ).execute()
        inserted = int(metrics.get("num_target_rows_inserted", 0))
        updated = int(metrics.get("num_target_rows_updated", 0))
        self._merge_counts = (inserted, updated)
        return inserted + updated

    def _recheck(self, tickets: list[_Ticket]) -> list[_Ticket]:
        """Re-read versions at the current snapshot. A ticket with a stale document fails with
        ``ConcurrencyError`` (nothing of it is written); the others go on, refreshed."""
        ids = [w.row.id for t in tickets for w in t.writes]
        current = {r["id"]: r for r in self._scan(ids, S.CONTROL_COLUMNS).to_pylist()}
        version_now = int(self._dt.version())
        live: list[_Ticket] = []
        for t in tickets:
            fresh: list[DocumentWrite] = []
            for w in t.writes:
                found = current.get(w.row.id)
                have = int(found["version"]) if found else 0
                reborn = found is not None and found[S.INCARNATION] != w.row.incarnation
                if have != w.expected_version or reborn:
                    t.error, t.done = _stale(w, have, reborn=reborn), True
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
        ticket = _Ticket(
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
        merged: dict[str, tuple[int, bool, str | None]] = {}  # id -> (seq, checked, incarnation)
        for t in tickets:
            for doc_id, seq in t.marks.items():
                checked = t.incarnations is not None
                life = t.incarnations.get(doc_id) if t.incarnations is not None else None
                held = merged.get(doc_id)
                if held is None or (held[1], held[2]) != (checked, life) or held[0] < seq:
                    merged[doc_id] = (seq, checked, life)  # a later ticket's life wins
        try:
            version = self._merge_watermarks(merged)
        except Exception as e:
            _finish(tickets, error=_store_error(f"advancing watermarks in {self.uri} failed", e))
            return
        if len(tickets) > 1:
            self.watermark_groups += 1
        _finish(tickets, version=version)

    def _merge_watermarks(self, marks: Mapping[str, tuple[int, bool, str | None]]) -> int | None:
        ids = list(marks)
        source = pa.table(
            {
                "id": pa.array(ids, pa.string()),
                "bucket": pa.array([self.bucket(i) for i in ids], pa.int32()),
                "dispatched_seq": pa.array([marks[i][0] for i in ids], pa.int64()),
                "_checked": pa.array([marks[i][1] for i in ids], pa.bool_()),
                "_life": pa.array([marks[i][2] for i in ids], pa.string()),
            }
        )
        buckets = _in_list(self.bucket(i) for i in ids)
        attempts = self._max_retries * 3 + 1  # a watermark must land: it has no version check
        for attempt in range(attempts):
            self._update()
            try:
                metrics = (
                    self._dt.merge(
                        source,
                        predicate=f"t.bucket IN ({buckets}) AND t.bucket = s.bucket "
                        "AND t.id = s.id",
                        source_alias="s",
                        target_alias="t",
                        streamed_exec=False,
                    )
                    .when_matched_update(
                        updates={"dispatched_seq": "greatest(t.dispatched_seq, s.dispatched_seq)"},
                        predicate="t.dispatched_seq < s.dispatched_seq AND (NOT s._checked "
                        f"OR t.{S.INCARNATION} IS NOT DISTINCT FROM s._life)",
                    )
                    .execute()
                )
            except Exception as e:
                if _commit_failed(e):
                    if attempt < attempts - 1:
                        self._backoff(attempt)
                    continue
                raise _store_error(f"advancing watermarks in {self.uri} failed", e) from e
            if int(metrics.get("num_target_rows_updated", 0)) == 0:
                return None
            return int(self._dt.version())
        raise CommitConflictError(
            f"advancing watermarks in {self.uri} kept conflicting with concurrent writers",
            hint="the rescuer will finish the job; check for a hot bucket",
        )


def _mark_rows(
    schema: pa.Schema,
    marks: Mapping[str, tuple[int, str | None]],
    ids: list[str],
    buckets: list[int],
) -> pa.Table:
    """Source rows that only raise watermarks: id, bucket, incarnation and ``_mark``; the
    document columns are null (no clause reads them for these rows)."""
    columns: dict[str, pa.Array] = {}
    for f in schema:
        if f.name == "id":
            columns[f.name] = pa.array(ids, f.type)
        elif f.name == "bucket":
            columns[f.name] = pa.array(buckets, f.type)
        elif f.name == S.INCARNATION:
            columns[f.name] = pa.array([marks[i][1] for i in ids], f.type)
        elif f.name == "_mark":
            columns[f.name] = pa.array([marks[i][0] for i in ids], f.type)
        elif f.name == "_expected":
            columns[f.name] = pa.array([-1] * len(ids), f.type)
        else:
            columns[f.name] = pa.nulls(len(ids), f.type)
    return pa.table(columns, schema=schema)


def _unreadable_log(uri: str, error: Exception) -> StoreError:
    """The error for a table whose log deltalake cannot read, naming the damaged commit file
    when the table is local (deltalake's own message names no file)."""
    log_dir = _local_log_dir(uri)
    damaged = None
    if log_dir is not None and log_dir.is_dir():
        for f in sorted(log_dir.glob("*.json")):
            try:
                for line in f.read_text().splitlines():
                    if line.strip():
                        json.loads(line)
            except (ValueError, OSError):
                damaged = f
                break
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if damaged is not None:
        return StoreError(
            f"the Delta log of the table at {uri} is damaged: {damaged.name} is not valid JSON "
            f"({first})",
            hint=f"restore {damaged} from a backup or a replica; Delta cannot rebuild its log "
            "from the data files",
        )
    return StoreError(
        f"the Delta log of the table at {uri} cannot be read: {first}",
        hint="restore the damaged file in _delta_log from a backup or a replica",
    )


def _local_log_dir(uri: str) -> Path | None:
    """``_delta_log`` of a table on the local file system (None for object stores)."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = Path(uri.removeprefix("file://"))
    return path / "_delta_log"


def _stale(w: DocumentWrite, found: int | None, *, reborn: bool = False) -> ConcurrencyError:
    if w.expected_version == 0 and not reborn:  # a create: the id is taken, nothing was "read"
        seen = "" if found is None else f" (at version {found})"
        return ConcurrencyError(
            f"document {w.row.id!r} already exists{seen}; nothing was written",
            hint=f"change it through uow.get({w.row.id!r}), or create it under a new id",
        )
    what = "already exists" if w.expected_version == 0 else "was changed"
    if reborn and w.expected_version:
        what = "was deleted and created again"
    seen = "" if found is None else f", found {found}"
    return ConcurrencyError(
        f"document {w.row.id!r} {what} since it was read (expected version "
        f"{w.expected_version}{seen}); nothing was written",
        hint="reload the document and apply the change again",
    )


def _store_error(what: str, e: BaseException) -> StoreError:
    """Our error for a deltalake, pyarrow or OS error (an ``OutboxError`` passes as it is)."""
    if isinstance(e, StoreError):
        return e
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return StoreError(f"{what}: {first}")


def _plain_strings(table: pa.Table) -> pa.Table:
    """Cast ``string_view`` (what DataFusion returns) to ``string``, which every kernel takes."""
    if not any("string_view" in str(f.type) for f in table.schema):
        return table
    fields = [pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields))


def _plain(t: pa.DataType) -> pa.DataType:
    if str(t) == "string_view":
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    return t


def quote_ids(ids: Iterable[str]) -> str:
    """SQL list literal of ids, for predicates passed to delta-rs."""
    return ", ".join(_sql_str(i) for i in ids)

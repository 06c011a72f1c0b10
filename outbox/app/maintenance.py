"""Table upkeep: the fold, compaction, checkpoints and a vacuum that keeps what the rescuer still
needs.

Every save appends a small file per bucket it touches and every version stays a row until folded
(``outbox.delta.fold``), so the fold and then compaction (``outbox.delta.compaction``) run every
``compact_every`` commits and through ``outbox maintain``: reads then open few files and fold few
rows. Compaction emits no change rows (``dataChange=false``), so the rescuer never sees it.

A vacuum deletes files of old versions. The rescuer reads the change data feed from its checkpoint
onward, so a vacuum whose retention would reach into that window (or into ``rescue_delay`` plus a
margin) is refused with an error that says what to do instead (``outbox.app.rescuer_history``,
imported here under the same names).

Log trimming (``outbox.delta.log``) keeps the ``_delta_log`` directory short, because deltalake
lists all of it after every commit; it stops at the oldest version a rescuer still has to read.

One ``outbox maintain`` works on a table at a time (``one_maintainer``, in ``maintainers`` with
the one-compactor rule, imported here under the same names): a second one started
meanwhile says so in one line and skips the table's upkeep, instead of folding the same buckets
and logging a commit conflict per bucket. ``forget_old_records`` is the SQL side of the upkeep:
every item of ``outbox.app.retention`` (the registry of what is kept and for how long).

Why one module: ``outbox maintain`` and the writers' own upkeep (``AutoCompactor``,
``AutoLogTrimmer``) run the same steps under the same guards (the rescuer's needed version, the
one-compactor rule, the one-maintainer rule, the maintenance lease on an object store); keeping
the steps and both schedules together keeps those guards read in one place. The guards
themselves live in ``maintainers`` (who may) and ``rescuer_history`` (what must stay), the steps
by role in ``outbox.delta`` (fold, compaction, log, repair).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from outbox.app import erasure
from outbox.app.maintainers import MAINTAIN_LOCK, exclusive, one_maintainer
from outbox.app.rescuer_history import (
    VACUUM_MARGIN,
    check_vacuum,
    commit_time,
    oldest_needed_version,
)
from outbox.core.clock import Clock
from outbox.core.errors import (
    StoreError,
    VacuumRefusedError,
    WorkspaceError,
)
from outbox.delta.compaction import compact, store_failure
from outbox.delta.fold import FOLD_AT, fold_table
from outbox.delta.log import trim_log
from outbox.delta.log_check import CHECK_LIMIT, find_damaged_commit
from outbox.delta.repair import DuplicateReport, find_duplicates, repair
from outbox.delta.store import DeltaDocumentStore

if TYPE_CHECKING:
    from outbox.core.settings import Settings

__all__ = [  # with the rescuer's history guard, imported from here before it moved
    "MAINTAIN_LOCK",
    "VACUUM_MARGIN",
    "WHOLE_LOG_LIMIT",
    "AutoCompactor",
    "AutoLogTrimmer",
    "MaintenanceKeywords",
    "MaintenanceOptions",
    "MaintenanceReport",
    "check_vacuum",
    "check_writable",
    "checkpoint",
    "commit_time",
    "compact",
    "exclusive",
    "forget_old_records",
    "live_files",
    "maintain",
    "oldest_needed_version",
    "one_maintainer",
    "trim_log_safely",
]

log = logging.getLogger("outbox.maintain")

#: How many commit files ``maintain`` checks before it works (the log trim reads old ones too,
#: so all of a trimmed log; a rescuer's lag holds back the trim, so that is its whole feed).
WHOLE_LOG_LIMIT = 10 * CHECK_LIMIT


@dataclass
class MaintenanceReport:
    version_before: int
    version_after: int = 0
    folded: dict[str, Any] = field(default_factory=dict)
    compacted: dict[str, Any] = field(default_factory=dict)
    checkpoint_written: bool = False
    vacuumed_files: int | None = None
    vacuum_retention_hours: float | None = None
    log_trim: dict[str, Any] | None = None
    #: Document versions held by more than one row (``outbox.delta.repair``), and the repair.
    duplicates: dict[str, Any] = field(default_factory=dict)
    erasures: dict[str, Any] = field(default_factory=dict)  # outbox.app.erasure.advance
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def checkpoint(store: DeltaDocumentStore) -> None:
    """Write a Delta checkpoint so opening the table does not replay the whole log."""
    with store._lock:
        try:
            store.refresh()
            store.delta_table.create_checkpoint()
        except Exception as e:
            raise store_failure("writing a checkpoint of", store, e) from e


@dataclass(frozen=True)
class MaintenanceOptions:
    """What ``maintain`` does: compaction and a checkpoint (each on by default), a guarded vacuum
    with ``vacuum_retention_seconds``, a log trim with ``log_retention_seconds``; ``dry_run``:
    vacuum and trim only report what they would delete."""

    do_compact: bool = True
    do_checkpoint: bool = True
    vacuum_retention_seconds: float | None = None
    dry_run: bool = False
    log_retention_seconds: float | None = None
    #: Fold a bucket once this share of its rows are superseded versions (0: every bucket with
    #: any); ``outbox.delta.fold``.
    fold_at: float = FOLD_AT
    #: Rewrite the buckets whose document versions are held by two rows (``outbox.delta.repair``).
    repair: bool = False


class MaintenanceKeywords(TypedDict, total=False):
    """``MaintenanceOptions``' fields as ``maintain``'s keyword arguments."""

    fold_at: float
    repair: bool
    do_compact: bool
    do_checkpoint: bool
    vacuum_retention_seconds: float | None
    dry_run: bool
    log_retention_seconds: float | None


def maintain(
    store: DeltaDocumentStore,
    *,
    clock: Clock,
    sql_url: str,
    rescue_delay_seconds: float,
    storage_options: Mapping[str, str] | None = None,
    settings: Settings | None = None,
    options: MaintenanceOptions | None = None,
    **keywords: Unpack[MaintenanceKeywords],
) -> MaintenanceReport:
    """Compaction, a checkpoint, then (with ``log_retention_seconds``) a log trim and (with
    ``vacuum_retention_seconds``) a guarded vacuum: ``options`` (``MaintenanceOptions``), and
    any of its fields as a keyword over it. The checkpoint comes before the trim so the trim has a
    fresh checkpoint to keep. ``settings``: read the rescuer checkpoints from the store it names
    (see ``oldest_needed_version``)."""
    opts = replace(options or MaintenanceOptions(), **keywords)
    start = time.perf_counter()
    if _writes(opts):
        check_writable(store)
    report = MaintenanceReport(version_before=store.refresh())
    damaged = find_damaged_commit(
        store.uri, storage_options or store._storage_options, limit=WHOLE_LOG_LIMIT
    )
    if damaged is not None:  # a checkpoint covers it, or the refresh above would have failed
        raise damaged.error(store.uri)
    duplicates = find_duplicates(store)
    report.duplicates = duplicates.to_dict()
    if duplicates.pairs and not (opts.repair and not opts.dry_run):
        log.warning(
            "%d document version(s) are held by two rows (e.g. %s): run `outbox maintain --repair`",
            duplicates.pairs,
            ", ".join(f"{i} v{v}" for i, v in duplicates.examples[:3]),
        )
    with one_maintainer(store, sql_url, clock) if _writes(opts) else nullcontext() as held:
        if held is None:
            where = _Where(clock, sql_url, rescue_delay_seconds, storage_options, settings)
            _upkeep(store, report, opts, duplicates, where)
        else:
            log.warning(
                "another `outbox maintain` is working on %s right now (%s): this one skipped "
                "the table's upkeep",
                store.uri,
                held,
            )
            report.folded = report.compacted = {"skipped": held}
    report.version_after = store.refresh()
    report.seconds = round(time.perf_counter() - start, 3)
    return report


@dataclass(frozen=True)
class _Where:
    """What ``maintain`` was told besides its options: where the rescuers' needs are read."""

    clock: Clock
    sql_url: str
    rescue_delay_seconds: float
    storage_options: Mapping[str, str] | None
    settings: Settings | None


def _upkeep(
    store: DeltaDocumentStore,
    report: MaintenanceReport,
    opts: MaintenanceOptions,
    duplicates: DuplicateReport,
    where: _Where,
) -> None:
    """``maintain``'s steps that change the table, under ``one_maintainer``."""
    clock, sql_url, settings = where.clock, where.sql_url, where.settings
    # a remote table's guard is the maintenance lease itself, which this process now holds
    remote = store._log_dir is None
    if duplicates.pairs and opts.repair and not opts.dry_run:
        with nullcontext() if remote else exclusive(store, sql_url, clock) as held:
            if held is None:
                report.duplicates = repair(store, duplicates).to_dict()
            else:
                log.warning("repair skipped: %s", held)
    if opts.do_compact:  # the fold first: it leaves fewer rows for the compaction to rewrite
        report.folded = fold_table(store, at=opts.fold_at).to_dict()
        report.compacted = compact(store, lease=nullcontext() if remote else None)
    if opts.do_checkpoint:
        checkpoint(store)
        report.checkpoint_written = True
    if opts.vacuum_retention_seconds is not None:
        # delta-rs takes whole hours: round *up*, and check the retention actually used.
        hours = max(1, math.ceil(opts.vacuum_retention_seconds / 3600))
        retention = timedelta(hours=hours)
        check_vacuum(
            store,
            retention=retention,
            rescue_delay=timedelta(seconds=where.rescue_delay_seconds),
            needed_version=oldest_needed_version(
                sql_url, store.uri, store.table_id, settings=settings
            ),
            clock=clock,
        )
        try:
            removed = store.delta_table.vacuum(
                retention_hours=hours, dry_run=opts.dry_run, enforce_retention_duration=False
            )
        except Exception as e:
            raise StoreError(f"vacuum of {store.uri} failed: {e}") from e
        report.vacuumed_files = len(removed)
        report.vacuum_retention_hours = hours
    if opts.log_retention_seconds is not None:
        report.log_trim = trim_log_safely(
            store,
            clock=clock,
            sql_url=sql_url,
            retention_seconds=opts.log_retention_seconds,
            storage_options=where.storage_options,
            dry_run=opts.dry_run,
            settings=settings,
        )
        if not opts.dry_run:  # each erasure the trim has passed: finished (outbox.app.erasure)
            report.erasures = erasure.advance(store, clock, sql_url, opts.log_retention_seconds)


def forget_old_records(
    settings: Settings,
    *,
    clock: Clock,
    dry_run: bool,
    upkeep: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The SQL side of the upkeep: every item of ``outbox.app.retention`` pruned (the queue's
    expired duplicate ids, the inboxes' records older than ``inbox_retention``, dead letters,
    finished claims, samples), with the table's items read from ``upkeep`` (this run's table
    report). ``retention`` lists each; the two counts of before stay under their keys. A count
    is None when nothing was pruned: a dry run, no queue database, or a store that cannot prune
    or be reached (logged)."""
    from outbox.app.retention import Place, prune_all

    place = Place(settings, clock, upkeep=upkeep)
    try:
        items = prune_all(place, dry_run=dry_run)
    finally:
        place.close()
    deleted = {i["setting"]: i["deleted"] for i in items}
    return {
        "expired_duplicate_ids_deleted": deleted["duplicate_detection_window"],
        "inbox_records_deleted": deleted["inbox_retention"],
        "inbox_retention_seconds": settings.inbox_retention,
        "retention": items,
    }


def _writes(opts: MaintenanceOptions) -> bool:
    """Whether ``opts`` change the table (a dry run and a bare report only read it)."""
    changes = opts.vacuum_retention_seconds is not None or opts.log_retention_seconds is not None
    return opts.do_compact or opts.do_checkpoint or (not opts.dry_run and (changes or opts.repair))


def check_writable(store: DeltaDocumentStore) -> None:
    """Refuse, in one line, to maintain a local table this user cannot write.

    Why up front: the steps would fail one by one (the compaction lock file, deltalake's own
    writes), each a driver error of its own, and a failed fold printed a Rust panic. An object
    store says no only when written to; its errors are translated where they happen.
    """
    log_dir = store._log_dir
    if log_dir is None:
        return
    folder = log_dir.parent
    if not (os.access(folder, os.W_OK) and os.access(log_dir, os.W_OK)):
        raise WorkspaceError(
            f"the table folder {folder} is read-only for this user: maintain rewrites its data "
            "files and its _delta_log",
            hint=f"run it as a user who can write {folder} (or where it is mounted writable); "
            "`outbox maintain --dry-run` and `outbox status` only read",
        )


class _EveryVersions:
    """The gate the upkeep listeners share: True once per ``every`` table versions (never when
    ``every`` is 0). It counts versions, not this process's commits, so several writer
    processes each run the upkeep at most once per ``every`` versions."""

    def __init__(self, store: DeltaDocumentStore, every: int) -> None:
        self._every = every
        self._next = (store.version() // every + 1) * every if every > 0 else 0
        self._lock = threading.Lock()

    def due(self, version: int) -> bool:
        if self._every <= 0:
            return False
        with self._lock:
            if version < self._next:
                return False
            self._next = (version // self._every + 1) * self._every
        return True


class AutoCompactor:
    """A commit listener that compacts every ``every`` commits (0 turns it off).

    It counts table versions, so with several writer processes each compacts at most once per
    ``every`` versions; a compaction that conflicts with a writer is skipped. With many writer
    processes, prefer ``compact_every = 0`` and a scheduled ``outbox maintain``.
    """

    def __init__(self, store: DeltaDocumentStore, every: int) -> None:
        # An object store has no lock a writer could take without a SQL round trip per run, and
        # deltalake commits two concurrent compactions of one version (every compacted row then
        # twice): writers there only fold (a data-changing rewrite, which conflicts as it
        # should), and a scheduled `outbox maintain` compacts under the maintenance lease.
        self._compacts = store._log_dir is not None
        if every > 0 and not self._compacts:
            log.debug(  # once per open: documented in docs/object-storage.md, not news each time
                "writers on %s fold every %d commits but do not compact (two could compact at "
                "once); schedule `outbox maintain`, which compacts under the maintenance lease",
                store.uri,
                every,
            )
        self._store = store
        self._gate = _EveryVersions(store, every)
        self.runs = 0

    def __call__(self, _rows: Any, version: int) -> None:
        if not self._gate.due(version):
            return
        fold_table(self._store)  # superseded versions out first: less for compaction to rewrite
        if self._compacts:
            compact(self._store)
        self.runs += 1


def trim_log_safely(
    store: DeltaDocumentStore,
    *,
    clock: Clock,
    sql_url: str,
    retention_seconds: float,
    storage_options: Mapping[str, str] | None = None,
    dry_run: bool = False,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Trim the Delta log behind the rescuer; skipped (reported, never raised) when the rescuer
    checkpoints cannot be read, because trimming blind could cut the rescuer's feed."""
    try:
        needed = oldest_needed_version(sql_url, store.uri, store.table_id, settings=settings)
    except VacuumRefusedError as e:
        log.warning("log trim skipped: %s", e)
        return {"skipped": str(e)}
    report = trim_log(
        store.uri,
        now=clock.now(),
        retention=timedelta(seconds=retention_seconds),
        needed=needed,
        storage_options=storage_options,
        dry_run=dry_run,
        live_files=live_files(store),
    )
    return report.to_dict()


def live_files(store: DeltaDocumentStore) -> set[str]:
    """The data files of the table's current snapshot (relative paths, as the log names them)."""
    from urllib.parse import unquote

    with store._lock:
        store.refresh()
        paths = store.delta_table.get_add_actions(flatten=True).column("path").to_pylist()
    return {unquote(str(p)) for p in paths}


class AutoLogTrimmer:
    """A commit listener that trims the Delta log every ``every`` versions (0 turns it off).

    Why in the writer: deltalake lists the whole log after each commit, so an untrimmed log makes
    every commit slower (docs/delta.md). A failure is logged and the next run tries again; the
    commit that triggered it has already happened.
    """

    def __init__(
        self,
        store: DeltaDocumentStore,
        every: int,
        *,
        sql_url: str,
        retention_seconds: float,
        clock: Clock,
        storage_options: Mapping[str, str] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._store = store
        self._gate = _EveryVersions(store, every)
        self._sql_url = sql_url
        self._settings = settings
        self._retention = retention_seconds
        self._clock = clock
        self._options = storage_options
        self.runs = 0
        self.last: dict[str, Any] | None = None

    def __call__(self, _rows: Any, version: int) -> None:
        if not self._gate.due(version):
            return
        try:
            self.last = trim_log_safely(
                self._store,
                clock=self._clock,
                sql_url=self._sql_url,
                retention_seconds=self._retention,
                storage_options=self._options,
                settings=self._settings,
            )
        except Exception as e:  # after the commit: report, never raise into the writer
            log.warning("log trim failed (the next one will retry): %s", e)
            self.last = {"failed": str(e)}
        self.runs += 1

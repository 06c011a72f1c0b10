"""Table upkeep: compaction, checkpoints and a vacuum that keeps what the rescuer still needs.

Small files make every MERGE slower (a 1-row MERGE rewrites the whole file holding the row), so
compaction runs every ``compact_every`` commits and through ``outbox maintain``. Compaction emits
no change rows (``dataChange=false``), so the rescuer never sees it.

A vacuum deletes files of old versions. The rescuer reads the change data feed from its checkpoint
onward, so a vacuum whose retention would reach into that window (or into ``rescue_delay`` plus a
margin) is refused with an error that says what to do instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from outbox.clock import Clock, utc
from outbox.delta.store import DeltaDocumentStore
from outbox.durations import format_duration
from outbox.errors import StoreError, VacuumRefusedError

log = logging.getLogger("outbox.maintain")

#: Vacuum retention must exceed the rescuer's needs by at least this much.
VACUUM_MARGIN = timedelta(hours=1)


@dataclass
class MaintenanceReport:
    version_before: int
    version_after: int = 0
    compacted: dict[str, Any] = field(default_factory=dict)
    checkpoint_written: bool = False
    vacuumed_files: int | None = None
    vacuum_retention_hours: float | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compact(store: DeltaDocumentStore) -> dict[str, Any]:
    """Rewrite small files into larger ones. A conflict with a writer is skipped, not raised."""
    from deltalake.exceptions import CommitFailedError

    with store._lock:
        store.delta_table.update_incremental()
        try:
            metrics: dict[str, Any] = store.delta_table.optimize.compact()
        except CommitFailedError as e:
            log.info("compaction skipped: a writer committed meanwhile (%s)", e)
            return {"skipped": "conflict"}
    return {
        k: metrics.get(k)
        for k in ("numFilesAdded", "numFilesRemoved", "partitionsOptimized", "totalConsideredFiles")
    }


def checkpoint(store: DeltaDocumentStore) -> None:
    """Write a Delta checkpoint so opening the table does not replay the whole log."""
    with store._lock:
        store.delta_table.update_incremental()
        store.delta_table.create_checkpoint()


def oldest_needed_version(sql_url: str, table_uri: str) -> int | None:
    """The oldest table version any rescuer of ``table_uri`` still has to read, or None."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from outbox.sql import make_engine

    engine = make_engine(sql_url)
    try:
        with engine.connect() as c:
            v = c.execute(
                text("SELECT min(version) FROM outbox_checkpoints WHERE table_uri = :u"),
                {"u": table_uri},
            ).scalar()
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    return None if v is None else int(v) + 1


def commit_time(store: DeltaDocumentStore, version: int) -> datetime | None:
    """Commit timestamp of ``version`` (None when the log no longer has it)."""
    for entry in store.delta_table.history(limit=max(1, store.version() - version + 1)):
        if int(entry.get("version", -1)) == version and "timestamp" in entry:
            return utc(datetime.fromtimestamp(int(entry["timestamp"]) / 1000))
    return None


def check_vacuum(
    store: DeltaDocumentStore,
    *,
    retention: timedelta,
    rescue_delay: timedelta,
    needed_version: int | None,
    clock: Clock,
) -> None:
    """Raise ``VacuumRefusedError`` when ``retention`` would cut into the rescuer's window."""
    floor = rescue_delay + VACUUM_MARGIN
    if retention < floor:
        raise VacuumRefusedError(
            f"vacuum retention {format_duration(retention.total_seconds())} is shorter than the "
            f"rescue delay plus a margin ({format_duration(floor.total_seconds())})",
            hint=f"use a retention of at least {int(floor.total_seconds() // 3600) + 1}h",
        )
    if needed_version is None or needed_version > store.version():
        return
    when = commit_time(store, needed_version)
    if when is None:
        return
    age = clock.now() - when
    if retention < age + VACUUM_MARGIN:
        raise VacuumRefusedError(
            f"vacuum with retention {format_duration(retention.total_seconds())} would delete "
            f"change-feed history from version {needed_version} (committed "
            f"{format_duration(age.total_seconds())} ago) that the rescuer has not read yet",
            hint="run `outbox rescue` first, or use a retention longer than "
            f"{int((age + VACUUM_MARGIN).total_seconds() // 3600) + 1}h",
        )


def maintain(
    store: DeltaDocumentStore,
    *,
    clock: Clock,
    sql_url: str,
    rescue_delay_seconds: float,
    do_compact: bool = True,
    do_checkpoint: bool = True,
    vacuum_retention_seconds: float | None = None,
    dry_run: bool = False,
) -> MaintenanceReport:
    start = time.perf_counter()
    report = MaintenanceReport(version_before=store.refresh())
    if do_compact:
        report.compacted = compact(store)
    if do_checkpoint:
        checkpoint(store)
        report.checkpoint_written = True
    if vacuum_retention_seconds is not None:
        retention = timedelta(seconds=vacuum_retention_seconds)
        check_vacuum(
            store,
            retention=retention,
            rescue_delay=timedelta(seconds=rescue_delay_seconds),
            needed_version=oldest_needed_version(sql_url, store.uri),
            clock=clock,
        )
        hours = max(1, int(retention.total_seconds() // 3600))
        try:
            removed = store.delta_table.vacuum(
                retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False
            )
        except Exception as e:
            raise StoreError(f"vacuum of {store.uri} failed: {e}") from e
        report.vacuumed_files = len(removed)
        report.vacuum_retention_hours = hours
    report.version_after = store.refresh()
    report.seconds = round(time.perf_counter() - start, 3)
    return report


class AutoCompactor:
    """A commit listener that compacts every ``every`` commits (0 turns it off)."""

    def __init__(self, store: DeltaDocumentStore, every: int) -> None:
        self._store = store
        self._every = every
        self._last = store.version()
        self.runs = 0

    def __call__(self, _rows: Any, version: int) -> None:
        if self._every <= 0 or version - self._last < self._every:
            return
        self._last = version
        compact(self._store)
        self.runs += 1

"""Upkeep: compaction keeps files few, and vacuum never eats history the rescuer still needs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from migrations.runner import migrate
from outbox.app.facade import Outbox
from outbox.app.maintenance import (
    AutoCompactor,
    check_vacuum,
    commit_time,
    maintain,
    oldest_needed_version,
)
from outbox.core.clock import ManualClock, SystemClock
from outbox.core.errors import VacuumRefusedError
from outbox.core.settings import Settings
from outbox.core.sql import make_engine
from tests.write_path.conftest import bare_outbox


def _write(ob: Outbox, n: int, prefix: str = "d") -> None:
    for i in range(n):
        with ob.unit_of_work() as uow:
            uow.create(f"{prefix}{i}", type="T").send("E", {}, destination="q")


def test_auto_compaction_every_n_commits_reduces_files(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    compactor = AutoCompactor(ob.store, 10)
    ob.add_commit_listener(compactor)
    _write(ob, 25)
    assert compactor.runs == 2
    plain = bare_outbox(workspace.parent / "plain")
    _write(plain, 25)
    plain.store.refresh()
    ob.store.refresh()
    assert len(ob.store.delta_table.file_uris()) < len(plain.store.delta_table.file_uris())
    # compaction emits no change rows: the feed only has the 25 inserts
    import pyarrow as pa

    cdf = pa.RecordBatchReader.from_stream(ob.store.delta_table.load_cdf(starting_version=0))
    assert cdf.read_all().num_rows == 25


def test_maintain_compacts_and_checkpoints(workspace: Path) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = Outbox.open(settings=settings, create=False, transport="memory")
    _write(ob, 12)
    ob.close()
    ob = bare_outbox(workspace)
    report = maintain(
        ob.store, clock=SystemClock(), sql_url=settings.sql_url, rescue_delay_seconds=15
    )
    # the dispatcher's mark rows made every bucket written due for a fold (which rewrites it
    # into one file), and the compaction bin-packs whatever small files are left
    assert report.folded["rows_removed"] >= 1
    ob.store.refresh()
    buckets = ob.store.delta_table.get_add_actions(flatten=True).column("partition.bucket")
    assert len(buckets) == len(set(buckets.to_pylist()))  # one file per bucket, whichever did it
    assert report.checkpoint_written
    assert list((workspace / "documents" / "_delta_log").glob("*.checkpoint.parquet"))


def test_vacuum_shorter_than_rescue_delay_is_refused(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    with pytest.raises(VacuumRefusedError, match="shorter than the rescue delay"):
        check_vacuum(
            ob.store,
            retention=timedelta(minutes=30),
            rescue_delay=timedelta(minutes=5),
            needed_version=None,
            clock=ManualClock(),
        )


def test_vacuum_refuses_history_the_rescuer_has_not_read(workspace: Path) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write(ob, 3)
    engine = make_engine(settings.sql_url)
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO outbox_checkpoints (table_uri, rescuer_name, version, generation, "
                "updated_at) VALUES (:u, 'default', 1, 1, CURRENT_TIMESTAMP)"
            ),
            {"u": settings.table_uri},
        )
    engine.dispose()
    needed = oldest_needed_version(settings.sql_url, settings.table_uri)
    assert needed == 2
    committed = commit_time(ob.store, 2)
    assert committed is not None
    clock = ManualClock(committed + timedelta(days=3))  # the rescuer is 3 days behind
    with pytest.raises(VacuumRefusedError, match=r"from version 2 .* not read yet"):
        check_vacuum(
            ob.store,
            retention=timedelta(days=2),
            rescue_delay=timedelta(seconds=15),
            needed_version=needed,
            clock=clock,
        )
    check_vacuum(  # a retention beyond the rescuer's lag is fine
        ob.store,
        retention=timedelta(days=4),
        rescue_delay=timedelta(seconds=15),
        needed_version=needed,
        clock=clock,
    )


def test_vacuum_guard_reads_commit_times_in_utc_whatever_the_local_zone(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the commit time was read as local wall time and labelled UTC."""
    import time as _time
    from datetime import UTC, datetime

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    _time.tzset()
    try:
        ob = bare_outbox(workspace)
        _write(ob, 2)
        [entry] = [e for e in ob.store.delta_table.history() if e["version"] == 1]
        committed = datetime.fromtimestamp(entry["timestamp"] / 1000, tz=UTC)
        assert commit_time(ob.store, 1) == committed
        clock = ManualClock(committed + timedelta(hours=10))  # the rescuer is 10 h behind
        with pytest.raises(VacuumRefusedError, match="not read yet"):
            check_vacuum(
                ob.store,
                retention=timedelta(hours=8),
                rescue_delay=timedelta(seconds=15),
                needed_version=1,
                clock=clock,
            )
    finally:
        monkeypatch.delenv("TZ")
        _time.tzset()


def test_vacuum_fails_closed_when_checkpoints_cannot_be_read(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    with pytest.raises(VacuumRefusedError, match="cannot tell which history"):
        maintain(
            ob.store,
            clock=SystemClock(),
            sql_url=f"sqlite:///{workspace / 'missing.db'}",
            rescue_delay_seconds=15,
            vacuum_retention_seconds=7 * 24 * 3600,
        )


def test_vacuum_retention_is_rounded_up_to_whole_hours(workspace: Path) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    report = maintain(
        ob.store,
        clock=SystemClock(),
        sql_url=settings.sql_url,
        rescue_delay_seconds=1800,
        vacuum_retention_seconds=6300,  # 1h45m: passes the 1h30m floor; must not vacuum at 1h
        dry_run=True,
    )
    assert report.vacuum_retention_hours == 2

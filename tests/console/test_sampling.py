"""The console's sampler (``outbox.app.sampling``): the numbers it takes from a workspace, the
rows it writes (one per metric and slot, pruned after the retention), a database it cannot write
to, and the hooks in ``outbox run-dispatcher`` and ``outbox rescue``.

Time is a ``ManualClock`` set from the real clock (commit timestamps are the writer's wall
clock): values are compared with what the table's own commit times give, never slept for."""

from __future__ import annotations

import logging
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox import Outbox
from outbox.app.cli import main
from outbox.app.history import (
    GEO_CLAIMS_IN_FLIGHT,
    OLDEST_PENDING_AGE,
    PENDING_DOCUMENTS,
    PENDING_MESSAGES,
    RESCUE_LAG_SECONDS,
    RESCUE_LAG_VERSIONS,
    Sample,
    slot_start,
)
from outbox.app.sampling import Sampler, record_sample, take_sample
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError, QueueUnavailableError
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore
from outbox.wiring import Backends
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.window import commit_times

INTERVAL = 60.0


@pytest.fixture
def clock() -> ManualClock:
    """10 s into a sampling slot two minutes ago (slots start at multiples of the interval): the
    commands the workspace enqueues are due by the real clock of a CLI run."""
    then = datetime.now(UTC).timestamp() - 120
    return ManualClock(datetime.fromtimestamp(then - then % INTERVAL + 10, tz=UTC))


@pytest.fixture
def ws(tmp_path: Path, clock: ManualClock) -> Path:
    """A migrated workspace: two pending documents (three messages, the first sent at the clock's
    start), deferred so nothing dispatches them, and rescuer 'nightly' at version 1."""
    path = tmp_path / "ws"
    with Outbox.open(
        path, clock=clock, dispatch="deferred", transport="memory", default_destination="q"
    ) as ob:
        with ob.unit_of_work() as uow:
            doc = uow.create("pkg-1", type="Package")
            doc.send("Left", {})
            doc.send("Arrived", {})
        clock.advance(20)
        with ob.unit_of_work() as uow:
            uow.create("pkg-2", type="Package").send("Left", {})
        with ob.unit_of_work() as uow:
            uow.create("pkg-3", type="Package")  # nothing to send: not pending
    store = SqlCheckpointStore(f"sqlite:///{path / 'outbox.db'}")
    try:
        store.write(
            str((path / "documents").absolute()),
            "nightly",
            expected_generation=None,
            version=1,
            at=clock.now(),
            details={},
        )
    finally:
        store.close()
    return path


def _settings(ws: Path, **changes: Any) -> Settings:
    return Settings.load(ws, env={}, **changes)


def _values(samples: list[Sample]) -> dict[tuple[str, str], float]:
    return {(s.metric, s.subject): s.value for s in samples}


def _rows(ws: Path, where: str = "1=1") -> list[tuple[Any, ...]]:
    with sqlite3.connect(ws / "outbox.db") as con:
        return con.execute(
            f"SELECT metric, subject, taken_at_s, value, source FROM outbox_samples WHERE {where} "
            "ORDER BY taken_at_s, metric, subject"
        ).fetchall()


def _commit_time(ws: Path, version: int) -> datetime:
    store = DeltaDocumentStore(str((ws / "documents").absolute()))
    try:
        latest = store.version()
        return {c.version: c.timestamp for c in commit_times(store.delta_table, latest + 1)}[
            version
        ]
    finally:
        store.close()


# --- what a sample holds -------------------------------------------------------------------------


def test_a_sample_holds_the_pending_work_its_age_and_each_rescuers_lag(
    ws: Path, clock: ManualClock
) -> None:
    start = clock.now() - timedelta(seconds=20)  # when pkg-1's messages were sent
    # The table: version 0 created it, 1..3 the three units of work; 'nightly' covers 1, so its
    # lag is the age of commit 2 (whose time is the writer's wall clock).
    clock.set(_commit_time(ws, 3) + timedelta(seconds=100))
    values = _values(take_sample(_settings(ws), clock))
    assert values == {
        (PENDING_DOCUMENTS, ""): 2,
        (PENDING_MESSAGES, ""): 3,
        (OLDEST_PENDING_AGE, ""): round((clock.now() - start).total_seconds(), 1),
        (RESCUE_LAG_VERSIONS, "nightly"): 2,
        (RESCUE_LAG_SECONDS, "nightly"): round(
            (clock.now() - _commit_time(ws, 2)).total_seconds(), 1
        ),
        (GEO_CLAIMS_IN_FLIGHT, ""): 0,
    }
    assert values[(RESCUE_LAG_SECONDS, "nightly")] >= 100


def test_nothing_pending_leaves_the_age_out_and_a_rescuer_at_the_head_has_no_lag(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "ws"
    with (
        Outbox.open(path, clock=clock, transport="memory", default_destination="q") as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("pkg-1", type="Package").send("Left", {})  # sent at once
    latest = DeltaDocumentStore(str((path / "documents").absolute())).version()  # its mark too
    store = SqlCheckpointStore(f"sqlite:///{path / 'outbox.db'}")
    try:
        store.write(
            str((path / "documents").absolute()),
            "default",
            expected_generation=None,
            version=latest,
            at=clock.now(),
            details={},
        )
    finally:
        store.close()
    values = _values(take_sample(_settings(path), clock))
    assert values == {
        (PENDING_DOCUMENTS, ""): 0,
        (PENDING_MESSAGES, ""): 0,
        (RESCUE_LAG_VERSIONS, "default"): 0,
        (RESCUE_LAG_SECONDS, "default"): 0,
        (GEO_CLAIMS_IN_FLIGHT, ""): 0,
    }


def test_geo_claims_in_flight_count_pending_and_working_claims_of_the_sql_claim_log(
    ws: Path, clock: ManualClock
) -> None:
    from datetime import timedelta as td

    from dispatcher.claims.sql import SqlClaimLog

    log = SqlClaimLog(f"sqlite:///{ws / 'outbox.db'}")
    try:
        log.register("pkg-1", ["pkg-1/m1", "pkg-1/m2", "pkg-1/m3"], at=clock.now())
        assert log.claim("pkg-1/m1", "east", lease=td(seconds=30), at=clock.now()).won
        log.complete("pkg-1/m1", "east", at=clock.now())
        log.claim("pkg-1/m2", "east", lease=td(seconds=30), at=clock.now())  # working
    finally:
        log.close()
    assert _values(take_sample(_settings(ws), clock))[(GEO_CLAIMS_IN_FLIGHT, "")] == 2


def test_a_claim_log_that_is_not_sql_is_not_counted(
    ws: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cosmos DB (or a plugin's): a query there would cost request units every sample. The
    stand-in is what ``Backends.claim_log`` would hand out for ``claim_log = "cosmos"``."""
    monkeypatch.setattr(Backends, "claim_log", lambda _self: object())
    with caplog.at_level(logging.WARNING, logger="outbox.sampling"):
        values = _values(take_sample(_settings(ws), clock))
    assert (GEO_CLAIMS_IN_FLIGHT, "") not in values
    assert values[(PENDING_DOCUMENTS, "")] == 2
    assert caplog.records == []


def test_a_part_that_fails_is_one_warning_and_the_rest_is_still_sampled(
    ws: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def down(_self: Backends) -> Any:
        raise QueueUnavailableError("the checkpoint database is unreachable")

    monkeypatch.setattr(Backends, "checkpoint_store", down)
    with caplog.at_level(logging.WARNING, logger="outbox.sampling"):
        values = _values(take_sample(_settings(ws), clock))
    assert [r.getMessage() for r in caplog.records] == [
        "console sample: rescuer lag left out: the checkpoint database is unreachable"
    ]
    assert values[(PENDING_DOCUMENTS, "")] == 2
    assert not any(metric.startswith("rescue_lag") for metric, _ in values)


def test_a_table_that_cannot_be_read_leaves_out_the_table_and_the_lag(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ws"
    Outbox.open(path, clock=clock, transport="memory").close()
    settings = _settings(path, table_uri=str(tmp_path / "no-such-table"))
    with caplog.at_level(logging.WARNING, logger="outbox.sampling"):
        values = _values(take_sample(settings, clock))
    assert values == {(GEO_CLAIMS_IN_FLIGHT, ""): 0}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert warnings[0].startswith("console sample: pending documents left")


# --- what is written -----------------------------------------------------------------------------


def test_one_row_per_metric_and_slot_and_the_next_slot_writes_new_rows(
    ws: Path, clock: ManualClock
) -> None:
    settings = _settings(ws)
    slot = slot_start(clock.now(), INTERVAL)
    first = record_sample(settings, clock, source="dispatcher")
    assert first == 6  # the six values of test_a_sample_holds_...
    clock.set(slot + timedelta(seconds=INTERVAL - 1))  # the last second of the same slot
    assert record_sample(settings, clock, source="rescuer nightly") == 0
    assert {r[4] for r in _rows(ws)} == {"dispatcher"}  # the first in a slot wins
    clock.advance(1)  # the next slot
    assert record_sample(settings, clock, source="rescuer nightly") == 6
    slots = sorted({r[2] for r in _rows(ws)})
    assert len(slots) == 2
    assert _rows(ws, f"metric = '{PENDING_DOCUMENTS}'") == [
        (PENDING_DOCUMENTS, "", slots[0], 2.0, "dispatcher"),
        (PENDING_DOCUMENTS, "", slots[1], 2.0, "rescuer nightly"),
    ]


def test_rows_older_than_the_retention_are_pruned(ws: Path, clock: ManualClock) -> None:
    settings = _settings(ws, sample_retention="1h")
    assert record_sample(settings, clock, source="dispatcher") == 6
    clock.advance(1800)
    assert record_sample(settings, clock, source="dispatcher") == 6
    assert len({r[2] for r in _rows(ws)}) == 2
    clock.advance(1800 + INTERVAL)  # the first slot is now older than an hour; the second not
    assert record_sample(settings, clock, source="dispatcher") == 6
    assert len({r[2] for r in _rows(ws)}) == 2
    assert len(_rows(ws)) == 12


def test_sampling_off_writes_nothing(ws: Path, clock: ManualClock) -> None:
    settings = _settings(ws, sample_interval=0)
    assert record_sample(settings, clock, source="dispatcher") == 0
    sampler = Sampler(settings, clock, source="dispatcher").start()
    assert sampler._thread is None
    assert sampler.sample_once() == 0
    sampler.stop()
    assert _rows(ws) == []


@pytest.mark.parametrize("how", ["at revision 0005", "table dropped"])
def test_a_database_not_migrated_for_the_console_is_one_warning_and_no_error(
    ws: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    with sqlite3.connect(ws / "outbox.db") as con:
        con.execute("DROP TABLE outbox_samples")
        if how == "at revision 0005":
            con.execute("UPDATE outbox_sql_version SET version_num = '0005_session_states'")
    settings = _settings(ws)
    with caplog.at_level(logging.WARNING, logger="outbox.sampling"):
        assert record_sample(settings, clock, source="dispatcher") == 0
        clock.advance(INTERVAL)
        assert record_sample(settings, clock, source="rescuer nightly") == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("console samples are not recorded: the database sqlite:///")
    assert "run `outbox migrate` (or set sample_interval = 0)" in warnings[0]


def test_the_sampler_thread_samples_at_once_and_stops_when_told(
    ws: Path, clock: ManualClock
) -> None:
    stop = threading.Event()
    sampler = Sampler(_settings(ws, sample_interval="1h"), clock, source="dispatcher", stop=stop)
    sampler.start()
    done = threading.Event()
    for _ in range(600):  # a condition, not a duration: at most a minute on a loaded machine
        if sampler.samples or done.wait(0.1):
            break
    thread = sampler._thread
    assert thread is not None
    sampler.stop()
    assert stop.is_set()
    assert not thread.is_alive()
    assert sampler.samples == 1  # the next one was an hour away
    assert {r[4] for r in _rows(ws)} == {"dispatcher"}
    assert sampler._backends is None  # closed with the thread
    assert sampler._store is None


def test_sample_once_keeps_the_table_open_between_samples(ws: Path, clock: ManualClock) -> None:
    sampler = Sampler(_settings(ws), clock, source="dispatcher")
    try:
        assert sampler.sample_once() == 6
        store = sampler._store
        clock.advance(INTERVAL)
        assert sampler.sample_once() == 6
        assert sampler._store is store
    finally:
        sampler.stop()
    assert sampler._store is None


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"sample_interval": "500ms"}, "setting 'sample_interval' is invalid: 0.5s; must be 0"),
        ({"sample_interval": "-1"}, "setting 'sample_interval' has an invalid value '-1'"),
        ({"sample_retention": 0}, "setting 'sample_retention' is invalid: must be positive"),
    ],
)
def test_the_settings_are_validated(tmp_path: Path, changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        Settings.load(tmp_path, env={}, **changes)
    assert str(e.value).startswith(error)


def test_the_settings_read_durations_and_default_to_a_minute_and_a_week(tmp_path: Path) -> None:
    assert (Settings().sample_interval, Settings().sample_retention) == (60.0, 604800.0)
    s = Settings.load(
        tmp_path, env={"OUTBOX_SAMPLE_INTERVAL": "0", "OUTBOX_SAMPLE_RETENTION": "2d"}
    )
    assert (s.sample_interval, s.sample_retention) == (0.0, 172800.0)


# --- the hooks -----------------------------------------------------------------------------------


def test_run_dispatcher_once_records_a_sample_after_its_run(ws: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(ws), "run-dispatcher", "--once"])
    assert result.exit_code == 0, result.output
    rows = _rows(ws)
    assert {r[4] for r in rows} == {"dispatcher"}
    values = {(r[0], r[1]): r[3] for r in rows}
    assert values[(PENDING_DOCUMENTS, "")] == 0  # sampled after the worker sent them
    assert values[(PENDING_MESSAGES, "")] == 0
    assert values[(RESCUE_LAG_VERSIONS, "nightly")] == 3  # and the worker's watermark commit


def test_a_rescue_pass_records_the_rescuers_lag(ws: Path) -> None:
    """Fails when ``outbox rescue`` no longer samples after its pass (checked by removing the
    hook: no row then has the source 'rescuer nightly')."""
    result = CliRunner().invoke(main, ["-w", str(ws), "rescue", "--name", "nightly"])
    assert result.exit_code == 0, result.output
    rows = _rows(ws, "source = 'rescuer nightly'")
    lag = {(r[0], r[1]): r[3] for r in rows if r[0].startswith("rescue_lag")}
    assert set(lag) == {(RESCUE_LAG_VERSIONS, "nightly"), (RESCUE_LAG_SECONDS, "nightly")}
    assert lag[(RESCUE_LAG_SECONDS, "nightly")] >= 0


def test_rescue_every_samples_after_each_pass_failed_ones_too(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's hook, driven through ``_loop`` with a scheduler that runs two passes (the
    second fails): a sample follows each."""
    from outbox.app.cli import rescue as cli_rescue
    from rescuer.scheduler import Scheduler

    calls: list[str] = []
    real_run = Scheduler.run

    def two_passes(self: Scheduler, *, full_first: bool = False, **_: Any) -> int:
        return real_run(self, full_first=full_first, max_passes=2)

    runs = iter([None, RuntimeError("boom")])

    class Pass:
        def run(self, *, full: bool = False) -> Any:
            failure = next(runs)
            if failure is not None:
                raise failure
            from rescuer.runner import PassReport

            return PassReport(
                table_uri="t",
                rescuer_name="nightly",
                engine="local",
                mode=None,
                started_at=datetime.now(UTC),
                duration_s=0.0,
                delay_s=15.0,
                latest_version=0,
                checkpoint_before=0,
                checkpoint_after=0,
                window_start=None,
                window_end=None,
                versions_scanned=0,
                change_rows=0,
                documents_examined=0,
                pending_documents=0,
                commands_enqueued=0,
                duplicates_dropped=0,
                lag_versions=0,
                lag_seconds=0.0,
            )

    monkeypatch.setattr(Scheduler, "run", two_passes)
    cli_rescue._loop(
        Pass(),  # type: ignore[arg-type]
        1.0,
        ManualClock(),
        full=False,
        as_json=True,
        after_pass=lambda: calls.append("sampled"),
    )
    assert calls == ["sampled", "sampled"]

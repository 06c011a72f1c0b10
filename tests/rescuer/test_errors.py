"""Driver errors at the engine edges: translated into our tree, and never fatal to ``--every``."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pyarrow as pa
import pytest

from outbox.core.clock import ManualClock
from outbox.core.errors import EngineError, FeedUnavailableError
from rescuer.cdf_local import LocalEngine, read_feed
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.planner import FeedWindow, Plan
from rescuer.runner import RescuePass
from rescuer.scheduler import Scheduler
from rescuer.sink import InMemorySink
from rescuer.window import find_window_end
from tests.rescuer.conftest import DELAY, Table


class _FailsOnce:
    """The local engine, except that the first sweep raises a raw ``OSError``."""

    name = "local"

    def __init__(self) -> None:
        self.inner = LocalEngine()
        self.failed = False

    def plan_feed(self, table_uri: str, window: FeedWindow) -> Plan:
        return self.inner.plan_feed(table_uri, window)

    def plan_sweep(self, table_uri: str, version: int) -> Plan:
        if not self.failed:
            self.failed = True
            raise OSError(errno.ECONNRESET, "Connection reset by peer")
        return self.inner.plan_sweep(table_uri, version)

    def close(self) -> None:
        self.inner.close()


def test_scheduler_survives_a_raw_driver_error_and_the_next_pass_succeeds(
    table: Table, caplog: pytest.LogCaptureFixture
) -> None:
    v = table.put(("a", 1))
    clock = ManualClock(table.at(v, DELAY + 1))
    sink, checkpoints = InMemorySink(), InMemoryCheckpointStore()
    rescue = RescuePass(table.store, _FailsOnce(), checkpoints, sink, clock=clock, delay=DELAY)  # type: ignore[arg-type]
    reports: list[Any] = []
    errors: list[Exception] = []
    scheduler = Scheduler(
        rescue, every=30.0, clock=clock, on_report=reports.append, on_error=errors.append
    )
    with caplog.at_level(logging.ERROR, logger="outbox.rescuer"):
        assert scheduler.run(max_passes=2) == 2
    assert (scheduler.failures, scheduler.unexpected) == (1, 1)
    assert [type(e) for e in errors] == [ConnectionResetError]  # what OSError(ECONNRESET) is
    assert any(
        "unexpected ConnectionResetError" in r.getMessage() and "Connection reset" in r.getMessage()
        for r in caplog.records
    )
    [report] = reports
    assert report.mode == "sweep"
    assert [c.id for c in sink.commands] == ["a"]
    assert report.checkpoint_after == v


def test_a_refresh_that_fails_in_the_driver_is_an_engine_error(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    rescue = RescuePass(
        table.store, LocalEngine(), InMemoryCheckpointStore(), InMemorySink(), delay=DELAY
    )

    def refresh() -> int:
        raise OSError(errno.ETIMEDOUT, "Operation timed out")

    monkeypatch.setattr(table.store, "refresh", refresh)
    with pytest.raises(EngineError, match=r"refreshing the table at .*TimeoutError.*timed out"):
        rescue.run()


class _History:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def version(self) -> int:
        return 5

    def history(self, _limit: int) -> list[dict[str, Any]]:
        raise self.error


def test_a_history_read_that_fails_in_the_driver_is_an_engine_error(table: Table) -> None:
    from deltalake.exceptions import DeltaError

    for error in (OSError(errno.EHOSTUNREACH, "No route to host"), DeltaError("Generic error")):
        with pytest.raises(EngineError, match="reading the newest 6 commits"):
            find_window_end(_History(error), now=table.at(0, 0), delay=DELAY)


def test_bugs_are_not_disguised_as_engine_errors(table: Table) -> None:
    with pytest.raises(KeyError):
        find_window_end(_History(KeyError("x")), now=table.at(0, 0), delay=DELAY)


def test_opening_the_table_fails_as_an_engine_error(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deltalake

    def unreachable(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr(deltalake, "DeltaTable", unreachable)
    with pytest.raises(EngineError, match="opening the table at"):
        LocalEngine().plan_sweep(table.uri, 0)


class _Feed:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def load_cdf(self, **_kwargs: Any) -> Any:
        raise self.error


WINDOW = FeedWindow(1, 3, 4)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        PermissionError(errno.EACCES, "Permission denied"),
        TimeoutError("timed out"),
    ],
)
def test_network_and_permission_errors_on_the_feed_are_engine_errors(error: Exception) -> None:
    with pytest.raises(EngineError, match="reading the change feed of t failed") as caught:
        read_feed(_Feed(error), "t", WINDOW)
    assert not isinstance(caught.value, FeedUnavailableError)


def test_a_vacuumed_file_on_the_feed_is_feed_unavailable() -> None:
    with pytest.raises(FeedUnavailableError, match=r"versions 2\.\.4"):
        read_feed(_Feed(FileNotFoundError(errno.ENOENT, "No such file")), "t", WINDOW)


# --- what counts as "the history is gone" (item: no sweep on a mere network error) -------------


def _delta_error(message: str) -> Exception:
    from deltalake.exceptions import DeltaError

    return DeltaError(message)


@pytest.mark.parametrize(
    ("error", "gone"),
    [
        # gone: an expired log, a vacuumed change-data file (as delta-rs 1.6.6 words them)
        (lambda: _delta_error("External error: Invalid table version: 6"), True),
        (
            lambda: pa.ArrowInvalid(
                "C Data interface error: External error: Parquet error: Failed to fetch metadata "
                "for file _change_data/bucket=3/part-0.snappy.parquet: Object Store error: Object "
                "at location /t/_change_data/bucket=3/part-0.snappy.parquet not found: No such "
                "file or directory (os error 2)"
            ),
            True,
        ),
        (lambda: FileNotFoundError(errno.ENOENT, "No such file or directory"), True),
        # not gone: these mention "version" or "not found" but are not missing history
        (lambda: _delta_error("Generic error: the table version could not be parsed"), False),
        (lambda: _delta_error("Schema error: field last_seq not found"), False),
        (lambda: _delta_error("Failed to read delta log object: Generic error: timeout"), False),
        (
            lambda: pa.ArrowInvalid(
                "External error: Object Store error: Generic MicrosoftAzure error: error sending "
                "request: connection reset by peer"
            ),
            False,
        ),
        (lambda: ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), False),
    ],
)
def test_only_missing_history_falls_back_to_a_sweep(error: Any, gone: bool) -> None:
    expected = FeedUnavailableError if gone else EngineError
    with pytest.raises(expected) as caught:
        read_feed(_Feed(error()), "t", WINDOW)
    assert isinstance(caught.value, FeedUnavailableError) is gone


def test_a_window_past_the_log_is_feed_unavailable_on_a_real_table(table: Table) -> None:
    v = table.put(("a", 1))
    with pytest.raises(FeedUnavailableError, match="Invalid table version"):
        read_feed(table.store.delta_table, table.uri, FeedWindow(v + 2, v + 3, v + 4))


def test_a_runner_does_not_sweep_on_a_network_error(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    sink = InMemorySink()
    rescue = RescuePass(
        table.store, LocalEngine(), InMemoryCheckpointStore(), sink, clock=clock, delay=DELAY
    )
    v = table.put(("a", 1))
    clock.set(table.at(v, DELAY + 1))
    assert rescue.run().mode == "sweep"
    v2 = table.put(("b", 1))
    clock.set(table.at(v2, DELAY + 1))
    from deltalake import DeltaTable

    def reset(*_a: Any, **_k: Any) -> Any:
        raise _delta_error("Generic error: version 3 request failed: connection reset")

    monkeypatch.setattr(DeltaTable, "load_cdf", reset)
    with pytest.raises(EngineError, match="connection reset"):
        rescue.run()
    assert [c.id for c in sink.commands] == ["a"]  # no sweep behind a misleading warning
    monkeypatch.undo()
    after = rescue.run()
    assert (after.mode, after.window_start, after.window_end) == ("feed", v, v2)
    assert [c.id for c in sink.commands] == ["a", "b"]


def test_both_engines_word_feed_unavailable_the_same_way() -> None:
    """One helper (``planner.feed_unavailable``) builds the message for both engines."""
    from rescuer.cdf_spark import _translate
    from rescuer.planner import feed_unavailable

    cause = "DELTA_CHANGE_DATA_FILE_NOT_FOUND: part-0.parquet"
    spark = _translate("t", "reading the change feed of", RuntimeError(cause), WINDOW)
    with pytest.raises(FeedUnavailableError) as local:
        read_feed(_Feed(FileNotFoundError(cause)), "t", WINDOW)
    assert isinstance(spark, FeedUnavailableError)
    assert str(spark) == str(local.value) == str(feed_unavailable("t", WINDOW, RuntimeError(cause)))
    assert str(spark).startswith(
        f"the change data feed of t cannot be read for versions 2..4: {cause}"
    )

"""Checkpoints: compare-and-set on SQLite and PostgreSQL, races between rescuers, bad rows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import update

from migrations.sql import upgrade
from migrations.sql.tables import checkpoints as checkpoints_table
from outbox.core.clock import ManualClock
from outbox.core.errors import CheckpointConflictError, CheckpointError
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import (
    CheckpointStore,
    InMemoryCheckpointStore,
    SqlCheckpointStore,
)
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink
from tests.rescuer.conftest import DELAY, Table

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    if request.param == "memory":
        yield InMemoryCheckpointStore()
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'outbox.db'}"
    else:
        url = str(request.getfixturevalue("pg_url"))
    upgrade(url)
    s = SqlCheckpointStore(url)
    yield s
    s.close()


def test_compare_and_set(store: CheckpointStore) -> None:
    assert store.read("t", "r") is None
    first = store.write("t", "r", expected_generation=None, version=3, at=NOW, details={"a": 1})
    assert (first.version, first.generation) == (3, 1)
    with pytest.raises(CheckpointConflictError, match="moved by another rescuer"):
        store.write("t", "r", expected_generation=None, version=4, at=NOW, details={})
    second = store.write("t", "r", expected_generation=1, version=5, at=NOW, details={})
    assert second.generation == 2
    with pytest.raises(CheckpointConflictError):
        store.write("t", "r", expected_generation=1, version=9, at=NOW, details={})
    got = store.read("t", "r")
    assert got is not None
    assert (got.version, got.generation) == (5, 2)
    assert [c.rescuer_name for c in store.list("t")] == ["r"]
    assert store.read("t", "other") is None


def test_forget_deletes_one_checkpoint_and_a_new_one_can_start(store: CheckpointStore) -> None:
    store.write("t", "r", expected_generation=None, version=3, at=NOW, details={})
    store.write("t", "keep", expected_generation=None, version=1, at=NOW, details={})
    assert store.forget("t", "r") is True
    assert store.forget("t", "r") is False
    assert store.read("t", "r") is None
    assert [c.rescuer_name for c in store.list("t")] == ["keep"]
    fresh = store.write("t", "r", expected_generation=None, version=7, at=NOW, details={})
    assert (fresh.version, fresh.generation) == (7, 1)


def test_racing_writers_neither_lose_nor_double_advance(store: CheckpointStore) -> None:
    """8 threads each add 1 to the version 10 times through read + CAS: exactly 80 advances."""
    store.write("t", "r", expected_generation=None, version=0, at=NOW, details={})

    def worker() -> None:
        done = 0
        while done < 10:
            cp = store.read("t", "r")
            assert cp is not None
            assert cp.version is not None
            try:
                store.write(
                    "t",
                    "r",
                    expected_generation=cp.generation,
                    version=cp.version + 1,
                    at=NOW,
                    details={},
                )
                done += 1
            except CheckpointConflictError:
                continue

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.read("t", "r")
    assert final is not None
    assert final.version == 80
    assert final.generation == 81


def test_corrupt_rows_are_clear_errors(sql_url: str) -> None:
    upgrade(sql_url)
    s = SqlCheckpointStore(sql_url)
    s.write("t", "r", expected_generation=None, version=1, at=NOW, details={})
    from outbox.core.sql import make_engine

    engine = make_engine(sql_url)
    with engine.begin() as conn:
        conn.execute(update(checkpoints_table).values(details="{not json"))
    with pytest.raises(CheckpointError, match=r"unreadable details.*outbox rescue --full"):
        s.read("t", "r")
    assert s.generation("t", "r") == 1
    with engine.begin() as conn:
        conn.execute(update(checkpoints_table).values(details="{}", version=-5))
    with pytest.raises(CheckpointError, match="version -5"):
        s.read("t", "r")
    engine.dispose()
    s.close()


def test_missing_schema_says_run_migrate(tmp_path: Any) -> None:
    s = SqlCheckpointStore(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(CheckpointError, match="outbox migrate"):
        s.read("t", "r")
    s.close()


def test_two_rescuers_racing_on_one_table(table: Table) -> None:
    """B finishes a pass while A is between its enqueue and its checkpoint write."""
    clock = ManualClock()
    shared = InMemoryCheckpointStore()
    sink = InMemorySink()
    v = table.put(("a", 1))
    clock.set(table.at(v, DELAY + 1))
    b = RescuePass(table.store, LocalEngine(), shared, sink, clock=clock, delay=DELAY)

    class RaceFirstWrite(InMemoryCheckpointStore):
        raced = False

        def write(self, *args: Any, **kwargs: Any) -> Any:
            if not self.raced:
                self.raced = True
                b.run()  # the other rescuer wins the race
            return shared.write(*args, **kwargs)

        def read(self, *args: Any, **kwargs: Any) -> Any:
            return shared.read(*args, **kwargs)

    a = RescuePass(table.store, LocalEngine(), RaceFirstWrite(), sink, clock=clock, delay=DELAY)
    report = a.run()
    assert report.checkpoint_after == v
    assert any("another rescuer" in w for w in report.warnings)
    final = shared.read(table.uri, "default")
    assert final is not None
    assert (final.version, final.generation) == (v, 1)  # advanced once, not twice
    assert len(sink.commands) == 1  # the same command id, deduplicated

    # A behind B: the later window wins, the checkpoint never moves backwards.
    v2 = table.put(("b", 1))
    clock.set(table.at(v2, DELAY + 1))
    assert b.run().checkpoint_after == v2
    clock.set(table.at(v, DELAY + 1))
    late = RescuePass(table.store, LocalEngine(), shared, sink, clock=clock, delay=DELAY).run()
    assert late.checkpoint_after == v2

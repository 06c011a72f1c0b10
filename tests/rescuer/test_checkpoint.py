"""Checkpoints: the kit's checkpoint-store contract (``outbox.testing.contracts.checkpoint_store``)
on memory, SQLite and PostgreSQL; then the SQL store's bad rows and two rescuers racing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from migrations.sql import upgrade
from migrations.sql.tables import checkpoints as checkpoints_table
from outbox.core.clock import ManualClock
from outbox.core.errors import CheckpointError
from outbox.testing.contracts.checkpoint_store import NOW, CheckpointStoreContract
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import CheckpointStore, InMemoryCheckpointStore, SqlCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink
from tests.rescuer.conftest import DELAY, Table


class TestInMemoryCheckpointStore(CheckpointStoreContract):
    def make_checkpoint_store(self) -> CheckpointStore:
        return InMemoryCheckpointStore()


class TestSqlCheckpointStore(CheckpointStoreContract):
    """Once per ``sql_url``: a SQLite file and a real PostgreSQL database."""

    @pytest.fixture(autouse=True)
    def _database(self, sql_url: str) -> None:
        upgrade(sql_url)
        self.url = sql_url

    def make_checkpoint_store(self) -> CheckpointStore:
        return SqlCheckpointStore(self.url)


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

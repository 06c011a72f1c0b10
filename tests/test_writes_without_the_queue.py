"""Writes do not depend on the queue database (issue 17): with PostgreSQL down, ``Outbox.open``
and ``unit_of_work`` still commit to Delta; the dispatch failure is logged and counted; once the
database is back, a rescue pass commands the documents and the worker delivers them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from dispatcher.worker import DispatcherWorker
from migrations.sql import upgrade
from outbox import Outbox
from outbox.core.clock import ManualClock
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import QueueSink
from tests.pg import PostgresServer


@pytest.mark.postgres
def test_writes_commit_while_the_queue_database_is_down(
    pg_server: PostgresServer | str,
    pg_url: str,
    workspace: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if isinstance(pg_server, str):
        pytest.skip("needs the test-managed PostgreSQL server to stop it")
    clock = ManualClock(datetime.now(UTC))  # the rescuer times commits by their Delta timestamps
    upgrade(pg_url)
    Outbox.open(workspace, sql_url=pg_url, clock=clock).close()  # creates the table
    pg_server.stop("immediate")
    try:
        with Outbox.open(
            workspace, sql_url=pg_url, clock=clock, default_destination="shipments"
        ) as ob:
            for i in range(3):
                with ob.unit_of_work() as uow:
                    uow.create(f"pkg-{i}", type="Package").send("Left", {"n": i})
            assert ob.store.version() == 3  # committed, queue or not
            metrics = ob.runtime.metrics.snapshot()
    finally:
        pg_server.restart()
    assert metrics.get("enqueue_failures") == 3, metrics
    failures = [r for r in caplog.records if "the rescuer will find them" in r.getMessage()]
    assert len(failures) == 3
    clock.advance(60)  # past the rescue delay
    with Outbox.open(workspace, sql_url=pg_url, clock=clock) as ob:
        checkpoints = SqlCheckpointStore(pg_url)
        try:
            sink = QueueSink(ob.runtime.commands, ob.settings.command_queue)
            rescued = RescuePass(ob.store, LocalEngine(), checkpoints, sink, clock=clock)
            assert rescued.run().commands_enqueued == 3
        finally:
            checkpoints.close()
        DispatcherWorker(ob.runtime).run(once=True)
        _, rows = ob.store.read([f"pkg-{i}" for i in range(3)])
        assert all(r.dispatched_seq == r.last_seq == 1 for r in rows.values())
        delivered = ob.runtime.queue.peek("shipments", 10)
        assert sorted(m.session_id or "" for m in delivered) == ["pkg-0", "pkg-1", "pkg-2"]

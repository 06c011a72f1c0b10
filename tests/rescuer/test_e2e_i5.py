"""I5 end to end: the dispatcher dies right after the commit; the rescuer (on its schedule) and the
command worker deliver everything within delay + poll interval (+ one command delivery)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dispatcher.invariants import verify_deliveries
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage
from outbox.testing.crash_points import InjectedCrash, crash_points
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.runner import PassReport, RescuePass
from rescuer.scheduler import Scheduler
from rescuer.sink import QueueSink
from tests.dispatcher.helpers import write_docs

DELAY, EVERY = 15.0, 30.0


def test_killed_dispatcher_is_rescued_within_delay_plus_interval(
    workspace: Path, clock: ManualClock
) -> None:
    memory = InMemoryTransport()
    ob = Outbox.open(workspace, clock=clock, transport=memory, default_destination="shipments")
    checkpoints = SqlCheckpointStore(ob.settings.sql_url)
    try:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 3, 2, prefix="warm")  # dispatched normally
        crash_points.arm("after_commit")
        try:
            with pytest.raises(InjectedCrash):
                write_docs(ob, committed, 5, 3, prefix="lost")
        finally:
            crash_points.disarm()
        assert len(memory.message_ids()) == 6  # only the first unit of work was sent
        crashed_at = ob.store.refresh()
        ts = int(ob.store.delta_table.history(1)[0]["timestamp"])
        committed_at = datetime.fromtimestamp(ts / 1000, tz=UTC)

        rescue_clock = ManualClock(committed_at)  # the rescuer's schedule starts at the commit
        rescue = RescuePass(
            ob.store,
            LocalEngine(),
            checkpoints,
            QueueSink(ob.runtime.queue, ob.settings.command_queue),
            clock=rescue_clock,
            delay=DELAY,
        )
        found: list[tuple[datetime, PassReport]] = []
        scheduler = Scheduler(rescue, every=EVERY, clock=rescue_clock)

        def on_report(r: PassReport) -> None:
            if r.commands_enqueued:
                found.append((rescue_clock.now(), r))
                scheduler.stop()

        scheduler.on_report = on_report
        scheduler.run(max_passes=10)
        assert found, "the rescuer never enqueued the lost documents"
        when, report = found[0]
        assert report.commands_enqueued == 5
        assert report.window_end == crashed_at
        assert (when - committed_at).total_seconds() <= DELAY + EVERY

        worker = DispatcherWorker(ob.runtime, batch_size=8, poll_interval=1.0)
        stats: Any = worker.run(until_idle=True)
        assert stats is not None
        result = verify_deliveries(committed, memory.deliveries)
        assert result.ok, result.describe()
        assert ob.store.scan_pending().num_rows == 0
    finally:
        checkpoints.close()
        ob.close()

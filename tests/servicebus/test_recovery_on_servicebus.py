"""Proof on the Service Bus fake: the dispatcher dies right after the commit; the rescuer sends
ProcessDocument to the Service Bus command queue (session = document id, message id = command id);
the same ``run-dispatcher`` worker receives it there and delivers everything; a repeated rescue
pass is dropped by duplicate detection; a failed immediate dispatch schedules its retry there."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")

from dispatcher.invariants import verify_deliveries
from dispatcher.servicebus import sdk as servicebus_sdk
from dispatcher.servicebus.command_queue import ServiceBusCommandQueue
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage
from outbox.testing.crash_points import InjectedCrash, crash_points
from outbox.testing.faulty import FaultyTransport
from outbox.testing.servicebus_fake import FakeServiceBus, clients
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.runner import run_pass
from tests.dispatcher.helpers import write_docs
from tests.servicebus.fakes import namespace


@pytest.fixture
def bus(clock: ManualClock) -> Iterator[FakeServiceBus]:
    fake = namespace(clock, "outbox-commands")
    with servicebus_sdk.use_clients(clients(fake)):
        yield fake


@pytest.mark.parametrize("concurrency", [1, 3])
def test_crash_after_commit_is_rescued_through_service_bus(
    workspace: Path, clock: ManualClock, bus: FakeServiceBus, concurrency: int
) -> None:
    memory = InMemoryTransport()
    ob = Outbox.open(
        workspace,
        clock=clock,
        transport=memory,
        default_destination="shipments",
        command_transport="servicebus",
    )
    checkpoints = SqlCheckpointStore(ob.settings.sql_url)
    sink = ob.backends.command_sink()
    try:
        assert isinstance(ob.runtime.commands, ServiceBusCommandQueue)
        assert isinstance(sink.queue, ServiceBusCommandQueue)
        committed: dict[str, list[OutboxMessage]] = {}
        crash_points.arm("after_commit")
        try:
            with pytest.raises(InjectedCrash):
                write_docs(ob, committed, 4, 3, prefix="lost")
        finally:
            crash_points.disarm()
        assert memory.message_ids() == []
        ob.store.refresh()
        ts = int(ob.store.delta_table.history(1)[0]["timestamp"])
        later = ManualClock(datetime.fromtimestamp(ts / 1000, tz=UTC))
        later.advance(60)
        report = run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=later, delay=15)
        assert report.commands_enqueued == 4
        on_bus = bus.messages("outbox-commands")
        assert sorted(s.session_id or "" for s in on_bus) == sorted(committed)
        # a second pass over the same window (full) sends the same command ids: dropped
        run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=later, delay=15, full=True)
        assert len(bus.messages("outbox-commands")) == 4

        # poll_interval 0: an idle thread's wait would advance the shared ManualClock, and three
        # idle threads would race it past the session locks of the thread at work
        worker = DispatcherWorker(
            ob.runtime, concurrency=concurrency, batch_size=2, poll_interval=0.0
        )
        stats = worker.run(until_idle=True)
        assert (stats.commands, stats.completed) == (4, 4)
        result = verify_deliveries(committed, memory.deliveries)
        assert result.ok, result.describe()
        assert ob.store.scan_pending().num_rows == 0
        assert bus.messages("outbox-commands") == []
    finally:
        checkpoints.close()
        ob.close()


def test_failed_dispatch_retries_through_a_scheduled_service_bus_command(
    workspace: Path, clock: ManualClock, bus: FakeServiceBus
) -> None:
    memory = InMemoryTransport()
    faulty = FaultyTransport(memory, clock=clock)
    ob = Outbox.open(
        workspace,
        clock=clock,
        transport=faulty,
        default_destination="shipments",
        command_transport="servicebus",
    )
    try:
        faulty.fail_next(1)
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 1, 2, prefix="retry")
        [cmd] = bus.messages("outbox-commands")
        assert cmd.session_id == "retry0"
        assert cmd.visible_at > cmd.enqueued_at  # scheduled enqueue (the retry delay)
        stats = DispatcherWorker(ob.runtime, poll_interval=1.0).run(until_idle=True)
        assert stats.completed == 1
        assert verify_deliveries(committed, memory.deliveries).ok
    finally:
        ob.close()

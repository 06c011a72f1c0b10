"""``outbox.queue.messages`` for a Service Bus command queue: every count of its runtime
properties (``QueueRuntimeProperties``), read from the kit's fake namespace at collection."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("azure.servicebus")

from dispatcher.queue.messages import QueueMessage
from dispatcher.servicebus.command_queue import ServiceBusCommandQueue
from outbox.app.cli.telemetry_options import queue_depths
from outbox.core import telemetry
from outbox.core.clock import ManualClock
from outbox.testing.servicebus_fake import FakeServiceBus
from tests.telemetry.conftest import Otel

Q = "outbox-commands"


def depth_points(otel: Otel) -> dict[tuple[str, str], float]:
    data = otel.metrics.get_metrics_data()
    return {
        (str(p.attributes["queue"]), str(p.attributes["state"])): getattr(p, "value", -1)
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "outbox.queue.messages"
        for p in m.data.data_points
        if p.attributes
    }


def test_service_bus_depth_from_runtime_properties(otel: Otel) -> None:
    bus = FakeServiceBus(ManualClock())
    bus.admin().create_queue(Q, requires_session=True)
    queue = ServiceBusCommandQueue(bus.client(), bus.admin(), clock=bus.clock)
    later = bus.clock.now() + timedelta(minutes=5)
    queue.send(Q, [QueueMessage(b"{}", message_id=f"now-{i}", session_id="d") for i in range(3)])
    queue.send(Q, QueueMessage(b"{}", message_id="later", session_id="e", not_before=later))
    [poison] = queue.receive(Q, 1)
    queue.dead_letter(poison, "Poison", "test")
    telemetry.observe_queue_depth(queue_depths(queue))
    assert depth_points(otel) == {
        (Q, "active"): 2,
        (Q, "scheduled"): 1,
        (Q, "dead_lettered"): 1,
        (Q, "transfer"): 0,
        (Q, "transfer_dead_lettered"): 0,
    }

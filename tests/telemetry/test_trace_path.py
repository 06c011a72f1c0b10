"""One message's trace, from the application's request through a dispatcher crash, the rescuer,
the worker and the consumer: every span that handles the message is in the request's trace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Span, StatusCode

from dispatcher.queue.consumer import Consumer
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.testing.crash_points import InjectedCrash, crash_points
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import QueueSink
from tests.telemetry.conftest import Otel

DELAY = 15.0


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_one_trace_from_the_request_to_the_consumer(
    workspace: Path, clock: ManualClock, otel: Otel
) -> None:
    ob = Outbox.open(workspace, clock=clock, default_destination="shipments")
    try:
        request = _request_that_crashes_after_send(ob, otel)
        trace_id = request.get_span_context().trace_id
        _, rows = ob.store.read(["order-1"])
        stored = rows["order-1"].outbox[0].headers
        assert stored["traceparent"].split("-")[1] == f"{trace_id:032x}"  # kept in the Delta row

        _rescue_then_work(ob)
        handled: list[ReceivedMessage] = []
        consumer = Consumer(ob.runtime.queue, "shipments", handled.append, clock=clock)
        while consumer.run_once():
            pass
        assert handled
        assert all("traceparent" in m.headers for m in handled)  # through the SQL queue

        _check_spans(
            list(otel.spans.get_finished_spans()),
            trace_id=trace_id,
            root=request.get_span_context().span_id,
        )
        points = otel.metric_points()
        assert points["outbox.messages_sent"] == 2  # once before the crash, once by the worker
        assert points["outbox.commit.duration"] == 1
        assert points["outbox.rescue.commands_enqueued"] == 1
    finally:
        ob.close()


def _request_that_crashes_after_send(ob: Outbox, otel: Otel) -> Span:
    """The application's request saves a message; the dispatcher crashes once it is sent, before
    the watermark is written: the rescuer must finish it. The request's span."""
    app = otel.tracer_provider.get_tracer("the-application")
    crash_points.arm("after_send")
    with (
        app.start_as_current_span("POST /orders") as request,
        pytest.raises(InjectedCrash),
        ob.unit_of_work() as uow,
    ):
        uow.create("order-1", type="order").send("OrderPlaced", {"n": 1})
    crash_points.disarm()
    return request


def _rescue_then_work(ob: Outbox) -> None:
    """A rescue pass a minute after the commit enqueues its command; the worker sends it."""
    ts = int(ob.store.delta_table.history(1)[0]["timestamp"])
    later = ManualClock(datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(seconds=60))
    sink = QueueSink(ob.runtime.queue, ob.settings.command_queue)
    checkpoints = SqlCheckpointStore(ob.settings.sql_url)
    report = RescuePass(ob.store, LocalEngine(), checkpoints, sink, clock=later, delay=DELAY).run()
    assert report.commands_enqueued == 1
    DispatcherWorker(ob.runtime, batch_size=8, poll_interval=1.0).run(until_idle=True)


def _check_spans(spans: list[ReadableSpan], *, trace_id: int, root: int) -> None:
    commit = by_name(spans, "outbox.commit")
    immediate, retried = by_name(spans, "outbox.dispatch")  # in the order they ended
    (rescue,) = by_name(spans, "outbox.rescue")
    (worker,) = by_name(spans, "outbox.worker.commands")
    consumed = by_name(spans, "outbox.consume")
    (watermark,) = by_name(spans, "outbox.watermark")  # only the worker's got that far

    # The message's own path: all in the request's trace, each a child of the request.
    for s in [*commit, immediate, retried, *consumed]:
        assert s.context.trace_id == trace_id, s.name
        assert s.parent is not None, s.name
        assert s.parent.span_id == root, s.name
    assert immediate.status.status_code is StatusCode.ERROR  # the crash, recorded
    assert watermark.parent is not None
    assert watermark.parent.span_id == retried.context.span_id
    # The operator's jobs: the rescue pass's trace, the worker its child, linked to the message.
    assert rescue.context.trace_id != trace_id
    assert worker.context.trace_id == rescue.context.trace_id
    assert worker.parent is not None
    assert worker.parent.span_id == rescue.context.span_id
    assert {lk.context.span_id for lk in retried.links} >= {worker.context.span_id, root}
    assert commit[0].attributes is not None
    assert commit[0].attributes["outbox.messages"] == 1
    assert commit[0].attributes["outbox.commit.retries"] == 0
    assert rescue.attributes is not None
    assert rescue.attributes["outbox.rescue.commands_enqueued"] == 1

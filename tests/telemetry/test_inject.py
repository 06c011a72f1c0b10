"""``doc.send`` stores the trace context current at the send, looked up once per context: sends
under another span (or none) in the same unit of work carry that one's context."""

from __future__ import annotations

from pathlib import Path

from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from tests.telemetry.conftest import Otel


def test_each_send_carries_the_span_current_at_the_send(
    workspace: Path, clock: ManualClock, otel: Otel
) -> None:
    app = otel.tracer_provider.get_tracer("the-application")
    with (
        Outbox.open(workspace, clock=clock, default_destination="shipments") as ob,
        ob.unit_of_work() as uow,
    ):
        doc = uow.create("d", type="t")
        with app.start_as_current_span("first") as first:
            a1 = doc.send("A", {})
            a2 = doc.send("A", {})
        with app.start_as_current_span("second") as second:
            b = doc.send("B", {})
        none = doc.send("C", {})
        with app.start_as_current_span("first-again") as again:
            c = doc.send("D", {})

    def parent(span: object) -> str:
        sc = span.get_span_context()  # type: ignore[attr-defined]
        return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"

    assert a1.headers == a2.headers == {"traceparent": parent(first)}
    assert b.headers == {"traceparent": parent(second)}
    assert none.headers == {}
    assert c.headers == {"traceparent": parent(again)}

"""``TracingObserver``: the OpenTelemetry spans (and the rescuer's instruments) of the dispatch,
worker and rescue steps, as an observer of the seam (``outbox.core.observers``).

Why apart from ``telemetry``: that module is the SDK's edge (tracer, meter, header propagation);
this one says which steps get which span, with which attributes (docs/observability.md lists
them). Every span is skipped when nobody records spans (``telemetry.tracing()`` is False), so the
hot path does not build attributes for nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind

from outbox.core import telemetry
from outbox.core.observers import Observer


class TracingObserver(Observer):
    """Spans ``outbox.dispatch``, ``outbox.watermark``, ``outbox.worker.commands`` and
    ``outbox.rescue``; the rescue pass's gauges and counters."""

    def dispatching(
        self, rows: Sequence[Any], system: str
    ) -> contextlib.AbstractContextManager[Any]:
        if not telemetry.tracing():  # nobody records the span: skip its pass over the messages
            return contextlib.nullcontext()
        pending = [  # unsorted: the attributes do not depend on the order
            m
            for r in rows
            if r.has_pending
            for m in r.outbox
            if r.dispatched_seq < m.seq <= r.last_seq
        ]
        parent, links = telemetry.batch_parent(m.headers for m in pending)
        attributes = {
            "messaging.system": system,
            "messaging.destination.name": ",".join(sorted({m.destination for m in pending})),
            "messaging.batch.message_count": len(pending),
        }
        return telemetry.span("outbox.dispatch", parent=parent, links=links, attributes=attributes)

    def writing_watermark(self, documents: int) -> contextlib.AbstractContextManager[Any]:
        return telemetry.span("outbox.watermark", attributes={"outbox.documents": documents})

    def handling(self, received: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
        parent, links = telemetry.batch_parent(m.headers for m in received)
        return telemetry.span(
            "outbox.worker.commands",
            parent=parent,
            links=links,
            attributes={"messaging.batch.message_count": len(received)},
            kind=SpanKind.CONSUMER,
        )

    def rescuing(self, rescuer: str) -> contextlib.AbstractContextManager[Any]:
        """The pass's span: the commands it enqueues carry this trace."""
        return telemetry.span("outbox.rescue", attributes={"outbox.rescuer": rescuer})

    def rescued(self, report: Any) -> None:
        otel_trace.get_current_span().set_attributes(
            {
                "outbox.rescue.versions_scanned": report.versions_scanned,
                "outbox.rescue.documents_examined": report.documents_examined,
                "outbox.rescue.commands_enqueued": report.commands_enqueued,
                "outbox.rescue.lag_versions": report.lag_versions,
                "outbox.rescue.lag_seconds": report.lag_seconds,
            }
        )
        instrument = telemetry.instrument  # rescue lag and work (docs/observability.md)
        instrument("gauge", "outbox.rescue.lag.versions", "1", "table versions behind").set(
            report.lag_versions
        )
        instrument(
            "gauge", "outbox.rescue.lag.seconds", "s", "age of the oldest unscanned commit"
        ).set(report.lag_seconds)
        instrument(
            "gauge", "outbox.rescue.pending_documents", "1", "documents a pass found pending"
        ).set(report.pending_documents)
        instrument("counter", "outbox.rescue.passes", "1", "rescue passes").add(1)
        instrument("counter", "outbox.rescue.commands_enqueued", "1", "commands enqueued").add(
            report.commands_enqueued
        )


#: The process's tracing observer (stateless: one is enough).
TRACING = TracingObserver()

"""The OpenTelemetry SDK's in-memory span exporter and metric reader, routed to for one test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox.core import telemetry
from outbox.testing.crash_points import crash_points


@dataclass
class Otel:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def metric_points(self) -> dict[str, float]:
        """Each metric's value summed over its data points (histograms: their count)."""
        out: dict[str, float] = {}
        data = self.metrics.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        value = getattr(p, "value", None)
                        out[m.name] = out.get(m.name, 0) + (
                            value if value is not None else getattr(p, "count", 0)
                        )
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    crash_points.disarm()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry.use(tracer_provider, MeterProvider(metric_readers=[reader]))
    yield Otel(spans, reader, tracer_provider)
    telemetry.use(None, None)
    crash_points.disarm()

"""OpenTelemetry hooks: one place that knows the tracer, the meter and the W3C trace headers.

Why here (``outbox.core``, the lowest layer): the write path, the dispatcher, the rescuer and the
consumer all call it, and only ``opentelemetry-api`` is imported, which is a no-op until an SDK is
configured (``configure()`` with the ``otel`` extra, or the application's own SDK setup). So the
hooks cost a function call when telemetry is off.

**How a message's trace travels.** ``doc.send`` stores the current W3C ``traceparent`` /
``tracestate`` in the message's headers; the headers are saved with the message in the Delta row
and every transport carries them unchanged. Whoever handles the message later continues *that*
trace: a dispatch batch whose messages share one trace is that trace's child (the usual case: one
commit), the consumer helper's span is the child of the message's context. We chose a parent, not
only a span link, even when the rescuer sends the message an hour later: the user follows one
message from the request that wrote it to the handler that consumed it, and trace backends show
a late child fine. Operator jobs (a rescue pass, a worker command) keep their own traces and are
**linked** to the message traces they touched, since one pass or command serves many messages.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outbox.core.errors import ConfigurationError
from outbox.core.health import Health, serve

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

SCOPE = "delta-outbox"
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_LINKS = 32  # a batch of 500 messages from 500 requests links the first 32

#: seconds, from a fast commit to an hour-late rescue
SECONDS_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
)

_propagator = TraceContextTextMapPropagator()
_tracer_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None
_cache: dict[str, Any] = {}
_create_lock = threading.Lock()


def use(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> None:
    """Route this library's spans and metrics to these providers (tests, embedded use).

    ``None`` goes back to the global providers. The global ones can be set only once per
    process; this can be set any number of times.
    """
    global _tracer_provider, _meter_provider
    _tracer_provider, _meter_provider = tracer_provider, meter_provider
    _cache.clear()


def tracer() -> Tracer:
    t = _cache.get("tracer")
    if t is None:
        t = _cache["tracer"] = otel_trace.get_tracer(SCOPE, tracer_provider=_tracer_provider)
    return t


def tracing() -> bool:
    """Does anyone record this library's spans (an SDK provider, global or given to ``use``)?

    Why: a span's attributes can cost a pass over every message of a batch (its destinations,
    its messages' trace links); with the API alone every span is dropped, so the hot path skips
    building them.
    """
    provider = _tracer_provider or otel_trace.get_tracer_provider()
    return not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


def meter() -> Meter:
    m = _cache.get("meter")
    if m is None:
        provider = _meter_provider or otel_metrics.get_meter_provider()
        m = _cache["meter"] = provider.get_meter(SCOPE)
    return m


def instrument(kind: str, name: str, unit: str, description: str) -> Any:
    """The counter/histogram/up-down counter ``name``, created once per provider."""
    key = f"{kind}:{name}"
    inst = _cache.get(key)
    if inst is None:
        with _create_lock:  # the dispatcher's threads may ask for the same one at once
            inst = _cache.get(key)
            if inst is None:
                extra: dict[str, Any] = {}
                if kind == "histogram" and unit == "s":  # the SDK's default buckets are ms
                    extra["explicit_bucket_boundaries_advisory"] = SECONDS_BUCKETS
                factory = getattr(meter(), f"create_{kind}")
                inst = _cache[key] = factory(name, unit=unit, description=description, **extra)
    return inst


def observe(
    name: str, unit: str, description: str, read: Callable[[], Iterable[tuple[float, Any]]]
) -> None:
    """An observable gauge: ``read()`` gives (value, attributes) pairs when metrics are
    collected (a scrape); a failed read reports nothing, since no sample beats a wrong one."""
    key = f"observable:{name}"
    if key in _cache:
        return

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(value, attributes) for value, attributes in read()]
        except Exception:
            return []

    _cache[key] = meter().create_observable_gauge(
        name, [callback], unit=unit, description=description
    )


def observe_queue_depth(depths: Callable[[], Mapping[str, Mapping[str, float]]]) -> None:
    """``outbox.queue.messages{queue, state}``: each queue's depth by state, ``depths()`` giving
    ``{queue: {state: count}}`` (the SQL queue's ``QueueStats`` fields, or a Service Bus queue's
    runtime properties)."""
    observe(
        "outbox.queue.messages",
        "{message}",
        "queue depth by state",
        lambda: [
            (count, {"queue": name, "state": state})
            for name, states in depths().items()
            for state, count in states.items()
        ],
    )


# --- trace context in message headers -----------------------------------------------------


def inject_headers(headers: dict[str, str]) -> None:
    """Add the current trace context (``traceparent``, ``tracestate``) to ``headers``.

    Nothing is added outside a recording span, and headers the application set itself win.
    """
    if "traceparent" in headers:
        return
    # A unit of work's sends share one context (contexts are immutable: the same object means
    # the same current span), so the span is looked up and formatted once, not per message.
    ctx = otel_context.get_current()
    last = _cache.get("last_injected")
    if last is None or last[0] is not ctx:
        carrier: dict[str, str] = {}
        if otel_trace.get_current_span(ctx).get_span_context().is_valid:
            _propagator.inject(carrier, context=ctx)
        last = _cache["last_injected"] = (ctx, carrier)
    if last[1]:
        headers.update(last[1])


def extract_context(headers: Mapping[str, str] | None) -> Context | None:
    """The trace context the headers carry, or None when they carry none (or a malformed one)."""
    if not headers or "traceparent" not in headers:
        return None
    ctx = _propagator.extract(headers)
    return ctx if otel_trace.get_current_span(ctx).get_span_context().is_valid else None


def _span_context(ctx: Context) -> otel_trace.SpanContext:
    return otel_trace.get_current_span(ctx).get_span_context()


def batch_parent(
    headers: Iterable[Mapping[str, str]],
) -> tuple[Context | None, list[otel_trace.Link]]:
    """Parent and links for a span that handles many messages.

    The parent is the messages' trace when they all share one (else the current context); every
    distinct message context (up to ``MAX_LINKS``) is also a link, so none is lost.
    """
    contexts: dict[tuple[int, int], Context] = {}
    seen: set[str] = set()
    for h in headers:
        raw = h.get("traceparent") if h else None
        if raw is None or raw in seen:  # one commit's messages share one: parse it once
            continue
        seen.add(raw)
        ctx = extract_context(h)
        if ctx is not None:
            sc = _span_context(ctx)
            contexts.setdefault((sc.trace_id, sc.span_id), ctx)
            if len(contexts) > MAX_LINKS:
                break
    traces = {trace_id for trace_id, _ in contexts}
    parent = next(iter(contexts.values())) if len(traces) == 1 else None
    links = [otel_trace.Link(_span_context(c)) for c in list(contexts.values())[:MAX_LINKS]]
    return parent, links


@contextmanager
def span(
    name: str,
    *,
    parent: Context | None = None,
    links: Sequence[otel_trace.Link] | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: otel_trace.SpanKind = otel_trace.SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A current span; an exception (``InjectedCrash`` too) is recorded on it and re-raised.

    When ``parent`` is given and a span is already current (a worker command around a
    dispatch), the current span is added as a link so the operator's trace still finds it.
    """
    if parent is not None:
        current = otel_trace.get_current_span().get_span_context()
        if current.is_valid and current.trace_id != _span_context(parent).trace_id:
            links = [*(links or ()), otel_trace.Link(current)]
    with tracer().start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as s:
        try:
            yield s
        except BaseException as e:
            s.record_exception(e)
            s.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, type(e).__name__))
            raise


def record_error(error: BaseException) -> None:
    """Mark the current span failed with ``error`` (a handler's failure that was handled)."""
    current = otel_trace.get_current_span()
    current.record_exception(error)
    current.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, type(error).__name__))


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, with the current span's ``trace_id``/``span_id`` when there is
    one, so a log search can jump to the trace."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = otel_trace.get_current_span().get_span_context()
        if context.is_valid:
            line["trace_id"] = f"{context.trace_id:032x}"
            line["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


# --- the SDK (the ``otel`` extra) ---------------------------------------------------------


def _sdk_missing(e: ImportError) -> ConfigurationError:
    return ConfigurationError(
        f"metrics and trace export need the OpenTelemetry SDK, which is not installed ({e.name})",
        hint="pip install 'delta-outbox[otel]'",
    )


def configure(
    *,
    metrics_port: int | None = None,
    service_name: str = "delta-outbox",
    health: Health | None = None,
) -> None:
    """Install the SDK for a long-running command: Prometheus text on ``metrics_port`` (when
    given, with ``/healthz`` and ``/readyz`` from ``health`` on the same server) and OTLP export
    when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces/metrics variant) is set; the exporter
    reads the other standard ``OTEL_*`` variables itself.
    """
    otlp = any(
        os.environ.get(v)
        for v in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )
    if metrics_port is None and not otlp:
        return
    try:
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise _sdk_missing(e) from e
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    readers: list[MetricReader] = []
    if metrics_port is not None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
        except ImportError as e:
            raise _sdk_missing(e) from e
        readers.append(PrometheusMetricReader())  # its collector joins prometheus' REGISTRY
        serve(
            metrics_port,
            health or Health(),
            metrics=lambda: (generate_latest(REGISTRY), CONTENT_TYPE_LATEST),
        )
    tracer_provider = SdkTracerProvider(resource=resource)
    if otlp:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise _sdk_missing(e) from e
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use(tracer_provider, SdkMeterProvider(resource=resource, metric_readers=readers))

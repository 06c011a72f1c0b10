"""What OpenTelemetry costs the hot path: immediate dispatch with telemetry off vs on, same run.

    python -m benchmarks.telemetry           # results/telemetry.json
    python -m benchmarks.telemetry --quick   # fewer rounds (results/telemetry.quick.json)

"off" is the default install: ``opentelemetry-api`` with no SDK, every hook a no-op. "on" is the
SDK fully wired: every unit of work runs inside an application span (so each message carries a
``traceparent``), spans go through a ``BatchSpanProcessor`` to an exporter that drops them, and
metrics are recorded into an SDK ``MeterProvider`` (read once at the end). The two alternate,
``--reps`` times each per size, so machine noise hits both; the figure per case is the median.
The goal (issue 18) is at most 5% fewer messages/s with telemetry on.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.common import write_results
from outbox.app import Outbox
from outbox.core import telemetry

SIZES = (1, 100, 1000)


class DropExporter(SpanExporter):
    """Takes the finished spans and does nothing with them: the cost up to the network."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def run_case(root: Path, docs: int, rounds: int, *, on: bool, tag: str) -> float:
    """Messages per second (commit returned -> every send settled and the watermark written)."""
    provider: TracerProvider | None = None
    if on:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(DropExporter()))
        telemetry.use(provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    else:
        telemetry.use(None, None)  # the API alone: no SDK installed globally in this process
    app = provider.get_tracer("benchmark") if provider is not None else None
    try:
        with Outbox.open(root / tag, default_destination="shipments", transport="sql") as ob:
            runtime = ob.runtime
            with ob.unit_of_work() as uow:  # warm up
                uow.create("warm-up", type="Shipment").send("Created", {"i": 0})
            runtime.metrics.reset()
            for r in range(rounds):
                span: AbstractContextManager[Any] = (
                    app.start_as_current_span("request") if app is not None else nullcontext()
                )
                with span, ob.unit_of_work() as uow:
                    for i in range(docs):
                        doc = uow.create(f"r{r}-d{i}", type="Shipment", state={"s": "created"})
                        doc.send("StatusChanged", {"status": "left Seattle", "i": i})
            m = runtime.metrics
            assert m["messages_sent"] == docs * rounds, m.snapshot()
            return docs * rounds / sum(m.dispatch_latency)
    finally:
        if provider is not None:
            provider.shutdown()
        telemetry.use(None, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--reps", type=int, default=3, help="off/on pairs per size")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rounds = {1: 20, 100: 4, 1000: 1} if args.quick else {1: 60, 100: 10, 1000: 3}
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-telemetry-"))
    cases: dict[str, Any] = {}
    try:
        for docs in SIZES:
            runs: dict[str, list[float]] = {"off": [], "on": []}
            for rep in range(args.reps):
                for mode in ("off", "on"):
                    runs[mode].append(
                        run_case(
                            root, docs, rounds[docs], on=mode == "on", tag=f"{docs}-{mode}-{rep}"
                        )
                    )
            off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
            cases[f"{docs}_docs"] = {
                "docs_per_unit_of_work": docs,
                "rounds": rounds[docs],
                "reps": args.reps,
                "off_messages_per_second": round(off, 1),
                "on_messages_per_second": round(on, 1),
                "off_runs": [round(v, 1) for v in runs["off"]],
                "on_runs": [round(v, 1) for v in runs["on"]],
                "slowdown_percent": round((off - on) / off * 100, 1),
            }
            print(
                f"{docs:>5} docs/uow: off {off:>9.1f} msg/s  on {on:>9.1f} msg/s  "
                f"slowdown {cases[f'{docs}_docs']['slowdown_percent']:>5.1f}%"
            )
        results = {
            "transport": "sql (SQLite)",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "goal_slowdown_percent": 5,
            "cases": cases,
            "slowdown_percent": cases["1000_docs"]["slowdown_percent"],
            "headline": "1,000 documents per unit of work, coalesced sends, median of reps",
        }
        path = write_results("telemetry.quick" if args.quick else "telemetry", results)
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

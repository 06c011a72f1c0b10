"""What OpenTelemetry costs the hot path: immediate dispatch with telemetry off vs on, same run.

    python -m benchmarks.telemetry           # results/telemetry.json (5-15 min on 2 cores)
    python -m benchmarks.telemetry --quick   # fewer rounds and pairs
    python -m benchmarks.telemetry --smoke   # 10 documents, one pair

Run it on a quiet machine: single runs of one case spread far wider than a 5% cost (the file
records the load average before and after). "off" is the default install:
``opentelemetry-api`` with no SDK, every hook a no-op. "on" is the SDK fully wired: every unit
of work runs inside an application span (so each message carries a ``traceparent``), spans go
through a ``BatchSpanProcessor`` to an exporter that drops them, and metrics are recorded into an
SDK ``MeterProvider`` (read once at the end).

What is measured: messages per second over the units of work's wall time as the application
waits for it (documents built and sent, the commit, the immediate dispatch), since telemetry
hooks sit in all three; ``dispatch_only`` repeats the figures for the dispatch alone (commit
returned -> dispatch done, as ``benchmarks.dispatch`` measures it).

How noise is kept out of the verdict: the runs are **pairs**, off and on back to back, the order
alternating (off-on, on-off, ...) so a drift in the machine's speed favours neither; each pair
gives one slowdown, and the figure per case is the **median of the pairs' slowdowns**, with their
quartiles as the spread (``summarize``). Each run is a fresh workspace after a garbage
collection. The goal (issue 18) is at most 5% fewer messages/s with telemetry on; when the
spread is wider than the goal the file says the case is inconclusive rather than pass or fail.
Numbers live in the results file and the rendered docs only: no test asserts them.

A full run writes ``benchmarks/results/telemetry.json``; ``--quick`` and ``--smoke`` write
``telemetry.quick.json`` / ``telemetry.smoke.json`` into a fresh temporary folder, never into
benchmarks/results/; ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import add_output_options, save

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult

GOAL_PERCENT = 5.0
SIZES = (1, 100, 1000)


def drop_exporter() -> Any:
    """An exporter that takes the finished spans and does nothing with them: the cost up to the
    network. (The SDK is imported here: ``benchmarks.report`` imports ``summarize`` cheaply.)"""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class DropExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return DropExporter()


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize(off_runs: Sequence[float], on_runs: Sequence[float]) -> dict[str, Any]:
    """The figures of one case from its runs (``off_runs[i]`` and ``on_runs[i]`` a pair).

    ``slowdown_percent``: the median over pairs of ``(off - on) / off``; its interquartile range
    is the spread. ``verdict``: "within goal" when even the upper quartile is under the goal,
    "over goal" when even the lower quartile is over it, else "inconclusive" (noise wider than
    the difference: run again on a quieter machine, or with more ``--pairs``)."""
    pairs = [(off - on) / off * 100 for off, on in zip(off_runs, on_runs, strict=True)]
    low, high = _quartiles(pairs)
    verdict = (
        "within goal"
        if high <= GOAL_PERCENT
        else "over goal"
        if low > GOAL_PERCENT
        else "inconclusive"
    )
    return {
        "pairs": len(pairs),
        "off_messages_per_second": round(statistics.median(off_runs), 1),
        "on_messages_per_second": round(statistics.median(on_runs), 1),
        "off_range": [round(min(off_runs), 1), round(max(off_runs), 1)],
        "on_range": [round(min(on_runs), 1), round(max(on_runs), 1)],
        "slowdown_percent": round(statistics.median(pairs), 1),
        "slowdown_quartiles_percent": [round(low, 1), round(high, 1)],
        "pair_slowdowns_percent": [round(p, 1) for p in pairs],
        "verdict": verdict,
    }


def run_case(root: Path, docs: int, rounds: int, *, on: bool, tag: str) -> tuple[float, float]:
    """Messages per second two ways: over the whole unit of work as the application waits for it
    (documents built, the commit, the immediate dispatch: every hook telemetry adds), and over
    the dispatch alone (commit returned -> dispatch done, what ``benchmarks.dispatch`` reports)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from outbox.app.facade import Outbox
    from outbox.core import telemetry

    provider: TracerProvider | None = None
    if on:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(drop_exporter()))
        telemetry.use(provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    else:
        telemetry.use(None, None)  # the API alone: no SDK installed globally in this process
    app = provider.get_tracer("benchmark") if provider is not None else None
    gc.collect()  # garbage of the previous run is not this run's cost
    try:
        with Outbox.open(root / tag, default_destination="shipments", transport="sql") as ob:
            runtime = ob.runtime
            with ob.unit_of_work() as uow:  # warm up
                uow.create("warm-up", type="Shipment").send("Created", {"i": 0})
            runtime.metrics.reset()
            elapsed = 0.0
            for r in range(rounds):
                t0 = time.perf_counter()
                span: AbstractContextManager[Any] = (
                    app.start_as_current_span("request") if app is not None else nullcontext()
                )
                with span, ob.unit_of_work() as uow:
                    for i in range(docs):
                        doc = uow.create(f"r{r}-d{i}", type="Shipment", state={"s": "created"})
                        doc.send("StatusChanged", {"status": "left Seattle", "i": i})
                elapsed += time.perf_counter() - t0
            m = runtime.metrics
            assert m["messages_sent"] == docs * rounds, m.snapshot()
            return docs * rounds / elapsed, docs * rounds / sum(m.dispatch_latency)
    finally:
        if provider is not None:
            provider.shutdown()
        telemetry.use(None, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and pairs")
    parser.add_argument("--pairs", type=int, default=None, help="off/on pairs per size")
    add_output_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    sizes = (10,) if args.smoke else SIZES  # --smoke: one size; a second repeats its steps
    rounds = (
        dict.fromkeys(sizes, 2)
        if args.smoke
        else {1: 20, 100: 4, 1000: 1}
        if args.quick
        else {1: 40, 100: 10, 1000: 3}
    )
    pairs = args.pairs or (1 if args.smoke else 3 if args.quick else 11)
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-telemetry-"))
    load_before = os.getloadavg()
    started = time.monotonic()
    cases: dict[str, Any] = {}
    try:
        for docs in sizes:
            runs: dict[str, list[float]] = {"off": [], "on": []}
            dispatch: dict[str, list[float]] = {"off": [], "on": []}
            for pair in range(pairs):
                order = ("off", "on") if pair % 2 == 0 else ("on", "off")
                for mode in order:
                    tag = f"{docs}-{mode}-{pair}"
                    whole, alone = run_case(root, docs, rounds[docs], on=mode == "on", tag=tag)
                    runs[mode].append(whole)
                    dispatch[mode].append(alone)
            case = cases[f"{docs}_docs"] = {
                "docs_per_unit_of_work": docs,
                "rounds": rounds[docs],
                **summarize(runs["off"], runs["on"]),
                "off_runs": [round(v, 1) for v in runs["off"]],
                "on_runs": [round(v, 1) for v in runs["on"]],
                "dispatch_only": {
                    **summarize(dispatch["off"], dispatch["on"]),
                    "off_runs": [round(v, 1) for v in dispatch["off"]],
                    "on_runs": [round(v, 1) for v in dispatch["on"]],
                },
            }
            low, high = case["slowdown_quartiles_percent"]
            print(
                f"{docs:>5} docs/uow: off {case['off_messages_per_second']:>9.1f} msg/s  "
                f"on {case['on_messages_per_second']:>9.1f} msg/s  slowdown "
                f"{case['slowdown_percent']:>5.1f}% (quartiles {low:.1f}..{high:.1f}%, "
                f"{case['verdict']})"
            )
        results = {
            "transport": "sql (SQLite)",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(time.monotonic() - started, 1),
            "cpus": os.cpu_count(),
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
            "order": "pairs alternate off-on / on-off",
            "goal_slowdown_percent": GOAL_PERCENT,
            "cases": cases,
            "slowdown_percent": cases[f"{sizes[-1]}_docs"]["slowdown_percent"],
            "measure": "messages / the units of work's wall time (build, commit, dispatch); "
            "dispatch_only: messages / (commit returned -> dispatch done)",
            "headline": f"{sizes[-1]:,} documents per unit of work, coalesced sends, median of "
            "the pairs",
        }
        path = save(args, "telemetry", results)
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

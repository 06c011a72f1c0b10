"""The dispatcher's own cost per message (issue 45, P2c): no broker, no table, no database.

    python -m benchmarks.dispatcher_cost            # 1,000 messages x 200 rounds a side
    python -m benchmarks.dispatcher_cost --quick    # 1,000 x 50
    python -m benchmarks.dispatcher_cost --smoke    # 100 x 5
    python -m benchmarks.dispatcher_cost --profile  # cProfile of one dispatch, printed

Each round builds ``--messages`` rows (one document with one message each, as a unit of work's
commit hands them to the dispatcher: new documents, nothing dispatched) before the timing, and
sends them two ways, interleaved (the side that goes first alternates), so one machine load
applies to both:

* ``dispatch``: ``Dispatcher.dispatch(rows, defer_watermark=True)`` on an ``InMemoryTransport``,
  wired as the runtime wires it (the metrics, tracing and step-hook observers; a
  ``WatermarkWriter``, whose marks are taken between rounds as the next save would carry them;
  the paused keys in memory);
* ``floor``: a hand loop doing the work no dispatcher can skip: each row's pending messages (the
  seq filter), a ``TransportMessage`` each, one ``send`` of them all on another
  ``InMemoryTransport``, and the marks ``{id: (seq, incarnation)}``.

Per message: ``dispatch_us`` (the goal: at most 2 us, mean over the rounds), ``floor_us``, and
``own_us`` = dispatch - floor, the dispatcher's own work. ``rounds_us`` shows the spread (an
outlier round is most of a mean), and ``gc`` the collector's pauses during the dispatch rounds
(``gc.callbacks``), the suspects for those outliers; ``cpu_us`` is each side's CPU time on its
thread (the whole in-memory dispatch runs on the caller's), less moved by a busy machine than the
wall time. A full run writes
``benchmarks/results/dispatcher_cost.json``; ``--quick`` and ``--smoke`` write into a fresh
temporary folder, never into benchmarks/results/ (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import add_output_options, percentile, save
from dispatcher import hooks
from dispatcher.dispatch import Dispatcher
from dispatcher.metrics import DispatchMetrics, MetricsObserver
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.watermarks import WatermarkWriter
from outbox.core.model import DocumentRow, OutboxMessage, new_incarnation
from outbox.core.observers import Observers
from outbox.core.tracing import TRACING

GOAL_US = 2.0
DESTINATION = "shipments"


class _Recorded:
    """A mark store that only records (the writer's thread never writes during a round: its
    window is an hour, and the marks are taken between rounds)."""

    def advance_watermarks(self, marks: Any, incarnations: Any = None) -> int | None:
        return None


def rows_for(round_no: int, n: int, side: str) -> list[DocumentRow]:
    """``n`` new documents with one message each, as a commit saved them."""
    created = datetime.now(UTC)
    out = []
    for i in range(n):
        doc_id = f"{side}-r{round_no}-d{i}"
        life = new_incarnation()
        message = OutboxMessage(
            seq=1,
            message_id=f"{life}{i:08x}",
            destination=DESTINATION,
            type="StatusChanged",
            body=f'{{"status":"left Seattle","i":{i}}}',
            created_at=created,
        )
        out.append(
            DocumentRow(
                doc_id,
                "Shipment",
                1,
                {"status": "created"},
                1,
                0,
                [message],
                created,
                life,
            )
        )
    return out


def floor(transport: InMemoryTransport, rows: list[DocumentRow]) -> dict[str, Any]:
    """The irreducible work of a dispatch, by hand."""
    batch = []
    marks: dict[str, tuple[int, str | None]] = {}
    for r in rows:
        low, high = r.dispatched_seq, r.last_seq
        for m in r.outbox:
            if low < m.seq <= high:
                batch.append(
                    TransportMessage(
                        m.message_id,
                        m.destination,
                        m.body.encode("utf-8"),
                        m.type,
                        m.content_type,
                        m.ordering_key or r.id,
                        m.deliver_at,
                        m.correlation_id,
                        m.headers,
                        m.created_at,
                    )
                )
        marks[r.id] = (high, r.incarnation)
    transport.send(batch)
    return marks


class GcPauses:
    """The collector's pauses while ``on``: (generation, seconds) each."""

    def __init__(self) -> None:
        self.on = False
        self.pauses: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self.on:
            self.pauses.append((int(info["generation"]), time.perf_counter() - self._start))

    def summary(self) -> dict[str, Any]:
        total = sum(s for _, s in self.pauses)
        return {
            "collections": len(self.pauses),
            "gen2": sum(1 for g, _ in self.pauses if g == 2),
            "total_ms": round(total * 1000, 3),
            "max_ms": round(max((s for _, s in self.pauses), default=0.0) * 1000, 3),
        }


def _dispatcher() -> tuple[Dispatcher, InMemoryTransport, WatermarkWriter]:
    metrics = DispatchMetrics()
    observe = Observers([MetricsObserver(metrics), TRACING, hooks.observer()])
    writer = WatermarkWriter(_Recorded(), window=3600.0, observer=observe)
    transport = InMemoryTransport()
    return (
        Dispatcher(_Recorded(), transport, observer=observe, watermarks=writer),
        transport,
        writer,
    )


def _per_message_us(samples_s: list[float], n: int) -> dict[str, float]:
    us = [s / n * 1e6 for s in samples_s]
    return {
        "mean": round(statistics.fmean(us), 3),
        "p50": round(percentile(us, 50), 3),
        "p99": round(percentile(us, 99), 3),
        "max": round(max(us), 3),
    }


def run(n: int, rounds: int) -> dict[str, Any]:
    d, transport, writer = _dispatcher()
    bare = InMemoryTransport()
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    timed: dict[str, list[float]] = {"dispatch": [], "floor": []}
    cpu: dict[str, list[float]] = {"dispatch": [], "floor": []}
    try:
        d.dispatch(rows_for(-1, n, "warm"), defer_watermark=True)  # the pool, the writer thread
        floor(bare, rows_for(-1, n, "warm-floor"))
        for r in range(-2, rounds):  # two rounds of warm-up, not timed
            rows, floor_rows = rows_for(r, n, "d"), rows_for(r, n, "f")
            sides: list[tuple[str, Callable[[], Any]]] = [
                ("floor", lambda rows=floor_rows: floor(bare, rows)),
                (
                    "dispatch",
                    lambda rows=rows: d.dispatch(
                        rows, started=time.perf_counter(), defer_watermark=True
                    ),
                ),
            ]
            for name, side in sides if r % 2 else sides[::-1]:
                pauses.on = name == "dispatch" and r >= 0
                c0, t0 = time.thread_time(), time.perf_counter()
                result = side()
                elapsed, used = time.perf_counter() - t0, time.thread_time() - c0
                pauses.on = False
                if r >= 0:
                    timed[name].append(elapsed)
                    cpu[name].append(used)
                if name == "dispatch":
                    assert result.messages_sent == n, result
                    assert result.ok, result
            # between rounds, as the next save carries the marks, and the deliveries dropped
            batch = writer.take()
            if batch is not None:
                writer.settle(batch, None, carried=True)
            transport.clear()
            bare.clear()
    finally:
        gc.callbacks.remove(pauses)
        writer.abandon()
        d.close()
    dispatch, bare_floor = (
        _per_message_us(timed["dispatch"], n),
        _per_message_us(timed["floor"], n),
    )
    own = {k: round(dispatch[k] - bare_floor[k], 3) for k in ("mean", "p50")}
    return {
        "messages_per_round": n,
        "rounds": rounds,
        "dispatch_us": dispatch,
        "floor_us": bare_floor,
        "own_us": own,
        "dispatch_over_floor": round(dispatch["mean"] / bare_floor["mean"], 2),
        # the calling thread's CPU time (the whole dispatch here: one send, on that thread),
        # which a busy machine inflates much less than the wall time
        "cpu_us": {
            "dispatch": _per_message_us(cpu["dispatch"], n),
            "floor": _per_message_us(cpu["floor"], n),
        },
        "rounds_us": {
            "dispatch": [round(s / n * 1e6, 2) for s in timed["dispatch"]],
            "floor": [round(s / n * 1e6, 2) for s in timed["floor"]],
        },
        "gc": pauses.summary(),
        "goal_us": GOAL_US,
        "meets_goal": dispatch["mean"] <= GOAL_US,
    }


def profile(n: int) -> None:
    """cProfile of one dispatch of ``n`` messages (after a warm-up), its top lines printed."""
    d, _, writer = _dispatcher()
    try:
        d.dispatch(rows_for(-1, n, "warm"), defer_watermark=True)
        batch = writer.take()  # as the next save would carry them
        if batch is not None:
            writer.settle(batch, None, carried=True)
        rows = rows_for(0, n, "p")
        prof = cProfile.Profile()
        prof.enable()
        d.dispatch(rows, defer_watermark=True)
        prof.disable()
    finally:
        writer.abandon()
        d.close()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="50 rounds")
    parser.add_argument("--messages", type=int, help="messages per round (default 1000)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument(
        "--profile", action="store_true", help="profile one dispatch (printed, no results file)"
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    n = args.messages or (100 if args.smoke else 1000)
    if args.profile:
        profile(n)
        return
    rounds = args.rounds or (5 if args.smoke else 50 if args.quick else 200)
    data = run(n, rounds)
    path = save(args, "dispatcher_cost", data)
    print(
        f"dispatch {data['dispatch_us']['mean']:.2f} us/msg (p50 {data['dispatch_us']['p50']:.2f}),"
        f" floor {data['floor_us']['mean']:.2f}, own {data['own_us']['mean']:.2f} us/msg; "
        f"gc {data['gc']} -> {path}"
    )


if __name__ == "__main__":
    main()

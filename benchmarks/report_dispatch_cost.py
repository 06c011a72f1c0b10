"""The dispatcher's own cost per message (``dispatcher_cost.json``, issue 45 goal P2c), for
``benchmarks.report``: the block ``dispatcher-cost`` and the performance table's row."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def readme_row(data: dict[str, Any] | None = None) -> list[str]:
    """The performance table's line (``data``: a results file's contents; default the
    committed one)."""
    d = data if data is not None else load("dispatcher_cost")
    us, floor, own = d["dispatch_us"], d["floor_us"], d["own_us"]
    return [
        f"the dispatcher's own work: `Dispatcher.dispatch` of {n(d['messages_per_round'])} new "
        "documents (one message each) on the in-memory transport, as the runtime wires it, vs a "
        "hand loop doing what no dispatcher can skip (the pending filter, a `TransportMessage` "
        f"each, one send, the marks), interleaved, {n(d['rounds'])} rounds",
        f"**{n(us['mean'], 2)} µs** a message (goal ≤ {n(d['goal_us'], 0)} µs; p50 "
        f"{n(us['p50'], 2)}, p99 of rounds {n(us['p99'], 2)}), the hand loop "
        f"{n(floor['mean'], 2)} µs: the dispatcher's own {n(own['mean'], 2)} µs "
        f"({n(d['dispatch_over_floor'], 2)}× the loop); CPU on the calling thread "
        f"{n(d['cpu_us']['dispatch']['mean'], 2)} vs {n(d['cpu_us']['floor']['mean'], 2)} µs; "
        f"{n(d['gc']['collections'])} collector pauses in its rounds, "
        f"{n(d['gc']['total_ms'], 1)} ms",
        "`dispatcher_cost.json`",
    ]


def dispatcher_cost(data: dict[str, Any] | None = None) -> str:
    return table(["what", "figure", "source"], [readme_row(data)])


RENDERERS = {"dispatcher-cost": dispatcher_cost}

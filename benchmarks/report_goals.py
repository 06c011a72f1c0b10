"""The performance round's goals (issue 45) side by side, each from its results file and judged
against its goal, for the README's ``goals`` block (``benchmarks.report``)."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.report_common import load, n, table

#: id -> (what, the goal as said, the results file, (figure, met) from its data)
Goal = tuple[str, str, str, Callable[[dict[str, Any]], tuple[str, bool]]]


def _pipeline(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['over_floor'], 2)}×", bool(d["over_floor"] >= d["goal_over_floor"])


def _scale(d: dict[str, Any]) -> tuple[str, bool]:
    s, big = d["small"], d["large"]
    return (
        f"{n(d['cost_ratio'], 2)}× ({n(s['messages_per_second'])} vs "
        f"{n(big['messages_per_second'])} msg/s)",
        bool(d["meets_goal"]),
    )


def _own(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['dispatch_us']['mean'], 2)} µs", bool(d["dispatch_us"]["mean"] <= d["goal_us"])


def _apply(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['apply_over_raw_merge'], 2)}×", bool(d["apply_over_raw_merge"] <= 1.3)


def _spark_kafka(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['over_python_path'], 2)}×", bool(d["over_python_path"] >= 1.0)


def _kafka(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['ratio'], 2)}×", bool(d["ratio"] >= d["goal_ratio"])


def _folds(d: dict[str, Any]) -> tuple[str, bool]:
    return (
        f"{n(d['over_alone'], 2)}× ({n(d['with_folds_commits_per_second'], 1)} vs "
        f"{n(d['alone_commits_per_second'], 1)} commits/s); {d['bucket_folds']} folds done, "
        f"{d['bucket_folds_skipped']} skipped; longest wait for a fold "
        f"{n(d['longest_wait_s'], 1)} s, {d['starved']} starved",
        bool(d["meets_goal"]),
    )


def _small(d: dict[str, Any]) -> tuple[str, bool]:
    return f"{n(d['units_per_second'])} units/s", bool(d["meets_goal"])


def _consumer(d: dict[str, Any]) -> tuple[str, bool]:
    s, p = d["sqlite"], d["postgresql"]
    goal = d["goal"]
    rates = (s["consumer_1"]["per_s"], p["consumer_1"]["per_s"])
    ratios = (s["consumer_1_over_floor"], p["consumer_1_over_floor"])
    met = min(rates) >= goal["per_s"] and min(ratios) >= goal["over_floor"]
    return (
        f"{n(rates[0])} / {n(rates[1])} msg/s; {n(ratios[0], 2)}× / {n(ratios[1], 2)}× the floor",
        met,
    )


GOALS: dict[str, Goal] = {
    "P2": ("commit → settled, 1,000 documents a unit of work, vs the same work by hand",
           "≥ 0.5×", "pipeline", _pipeline),
    "P2b": ("dispatch cost a message at 100,000 documents a unit of work vs 1,000",
            "≤ 1.2×", "dispatch_scale", _scale),
    "P2c": ("the dispatcher's own cost a message (in-memory transport)", "≤ 2 µs",
            "dispatcher_cost", _own),
    "P8": ("Spark `apply` of 10,000 changes vs a raw delta-spark MERGE", "≤ 1.3×",
           "spark_write", _apply),
    "P8b": ("Spark executors sending 1,000,000 messages to Kafka vs the Python path, local[2]",
            "≥ 1.0×", "spark_kafka", _spark_kafka),
    "P11": ("Kafka: commit → every record acknowledged vs a raw producer", "≥ 0.8×", "kafka",
            _kafka),
    "P16": ("four writers and a fold every second vs the writers alone; every due bucket "
            "folded within 10 s", "≥ 0.8×, none starved", "fold_writers", _folds),
    "P17": ("64 threads each committing one document with one message, commit → settled",
            "≥ 1,000 units/s", "small_writers", _small),
    "P18": ("the queue's `Consumer`, one handler, SQLite / PostgreSQL, vs a raw-SQL floor",
            "≥ 10,000 msg/s, ≥ 0.25×", "consumer", _consumer),
}  # fmt: skip


def goals() -> str:
    rows = []
    for key, (what, goal, name, judge) in GOALS.items():
        figure, met = judge(load(name))
        rows.append([key, what, goal, figure, "yes" if met else "**no**", f"`{name}.json`"])
    return table(["goal", "what", "target", "measured", "met", "source"], rows)


RENDERERS = {"goals": goals}

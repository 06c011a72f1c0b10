"""Many small writers at once (``small_writers.json``, issue 45 goal P17), for
``benchmarks.report``: the block ``small-writers`` and the performance table's row."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table
from benchmarks.report_common import slash as _slash


def readme_row(data: dict[str, Any] | None = None) -> list[str]:
    """The performance table's line (``data``: a results file's contents; default the
    committed one)."""
    d = data if data is not None else load("small_writers")
    keys = sorted(d["cases"], key=int)
    cases = [d["cases"][k] for k in keys]
    top = d["cases"][str(d["headline_threads"])]
    goal = d["goal"]
    return [
        f"many small writers: {_slash(keys)} threads each committing one document with one "
        "message per unit of work, commit → settled on the embedded default (SQLite queue), "
        "best of 3 interleaved rounds; the same with each commit dispatched alone (no combining); "
        "a one-thread floor doing the same append and inserts in batches of as many units",
        f"{_slash([n(c['combined']['units_per_second'], 0) for c in cases])} units/s "
        f"(**{n(top['combined']['units_per_second'], 0)}** at {d['headline_threads']}; goal "
        f"≥ {n(goal['units_per_second'], 0)} at {goal['threads']}); alone "
        f"{_slash([n(c['alone']['units_per_second'], 0) for c in cases])}; "
        f"{n(top['combined']['units_per_commit'], 1)} units per Delta commit and "
        f"{n(top['combined']['commits_per_dispatch_call'], 1)} per dispatch call at "
        f"{d['headline_threads']}; {n(top['over_floor'], 2)}× the floor "
        f"({n(top['floor']['units_per_second'], 0)} units/s)",
        "`small_writers.json`",
    ]


def small_writers(data: dict[str, Any] | None = None) -> str:
    d = data if data is not None else load("small_writers")
    rows = []
    for k in sorted(d["cases"], key=int):
        c = d["cases"][k]
        for side in ("combined", "alone"):
            x = c[side]
            rows.append(
                [
                    f"{k}",
                    side,
                    n(x["units_per_second"], 1),
                    n(x["median_units_per_second"], 1),
                    n(x["units_per_commit"], 2),
                    n(x["commits_per_dispatch_call"], 2),
                    f"{n(x['caller_p50_ms'], 1)} / {n(x['caller_p99_ms'], 1)}",
                ]
            )
        rows.append([f"{k}", "floor", n(c["floor"]["units_per_second"], 1), "", "", "", ""])
    return table(
        [
            "threads",
            "side",
            "units/s (best)",
            "units/s (median)",
            "units per commit",
            "commits per dispatch call",
            "unit of work p50 / p99 ms",
        ],
        rows,
    )


RENDERERS = {"small-writers": small_writers}

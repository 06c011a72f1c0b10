"""The whole pipeline against the same work by hand (``pipeline.json``, issue 45 goal P2), for
``benchmarks.report``: the performance table's row."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n


def readme_row(data: dict[str, Any] | None = None) -> list[str]:
    """The performance table's line (``data``: a results file's contents; default the
    committed one)."""
    d = data if data is not None else load("pipeline")
    o, f, where = d["outbox"], d["floor"], d["outbox"]["where_ms_p50"]
    return [
        f"the pipeline on the embedded default, {n(d['documents_per_unit_of_work'])} new "
        "documents with one message each per unit of work, commit → settled (the queue's "
        "`Consumer` completed each, the marks written) vs the same append, SQLite inserts, "
        f"receive and complete done by hand, {n(d['rounds'])} interleaved rounds, medians",
        f"{n(o['messages_per_second'])} vs {n(f['messages_per_second'])} msg/s: "
        f"**{n(d['over_floor'], 2)}×** (goal ≥ {n(d['goal_over_floor'], 1)}×); the outbox's round "
        f"{n(o['round_ms_p50'], 1)} ms = unit of work {n(where['unit_of_work'], 1)} + consumer "
        f"{n(where['consumer'], 1)} + marks {n(where['marks_flush'], 1)} ms; the floor's "
        f"{n(f['round_ms_p50'], 1)} ms",
        "`pipeline.json`",
    ]

"""``outbox trace`` over a long history (``trace_history.json``, issue 46 item 1's goal), for
``benchmarks.report``: the block ``trace-history`` and the performance table's row."""

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table


def readme_row(data: dict[str, Any] | None = None) -> list[str]:
    d = data if data is not None else load("trace_history")
    t = d["trace"]
    figure = (
        f"p50 {n(t['p50_ms'], 1)} ms, p95 {n(t['p95_ms'], 1)} ms (goal ≤ {n(d['goal_ms'], 0)} "
        f"ms: {'met' if d['within_200ms'] else '**not met**'}); floor p50 "
        f"{n(d['floor']['p50_ms'], 1)} ms; {d['commits_shown']} commits shown"
    )
    floor = "the document's change data feed over that history"
    if "index_catch_up" in d:  # the commit index (before it, the feed read was the floor)
        floor = (
            "the trace's own reads: the snapshot and current row, the index's rows, "
            "their log entries"
        )
        c = d["index_catch_up"]
        figure += (
            f"; without the index, the feed read alone p50 {n(d['feed_read']['p50_ms'], 1)} ms; "
            f"the index's catch-up over {n(c['commits'])} commits {n(c['seconds'], 1)} s "
            f"({n(c['ms_per_commit'], 2)} ms a commit, once)"
        )
    return [
        f"`outbox trace` of a document changed every {d['traced_every']}th of "
        f"{n(d['commits'])} commits on a {n(d['documents'])}-document table "
        f"({n(d['history_versions'])} versions of retained history), vs its floor ({floor})",
        figure,
        "`trace_history.json`",
    ]


def trace_history(data: dict[str, Any] | None = None) -> str:
    return table(["what", "figure", "source"], [readme_row(data)])


RENDERERS = {"trace-history": trace_history}

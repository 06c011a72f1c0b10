"""The dispatch blocks (``dispatch.json``, its profile and its before, ``telemetry.json``), for
``benchmarks.report``."""

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table
from benchmarks.report_common import sig as _sig
from benchmarks.report_common import slash as _slash

_table = table


def dispatch() -> str:
    d = load("dispatch")["cases"]
    rows = []
    for k in (1, 100, 1000):
        inline, after = d[f"{k}_docs_coalesced_inline_watermark"], d[f"{k}_docs_coalesced"]
        first = d.get(f"{k}_docs_per_document")
        rows.append(
            [
                f"{n(k)} ({after['rounds']} commits)",
                f"{n(first['messages_per_second'])} msg/s" if first else "-",
                f"{n(inline['messages_per_second'])} msg/s, caller "
                f"{_sig(inline['caller_ms']['p50_ms'])} ms",
                f"{n(after['messages_per_second'])} msg/s, caller "
                f"{_sig(after['caller_ms']['p50_ms'])} ms",
                f"{n(inline['wall_messages_per_second'])} → "
                f"{n(after['wall_messages_per_second'])} msg/s",
                f"{after['watermark_merges']} (inline: {inline['watermark_merges']})",
            ]
        )
    header = [
        "documents per unit of work",
        "one send per document",
        "coalesced sends, watermark MERGE inline (p50 caller)",
        "coalesced sends, watermarks coalesced (p50 caller)",
        "whole loop, inline → coalesced",
        "watermark MERGEs",
    ]
    return _table(header, rows)


def telemetry() -> str:
    """``python -m benchmarks.telemetry``: off/on pairs per size, the median pair's slowdown."""
    from benchmarks.telemetry import summarize  # stdlib only at import

    t = load("telemetry")
    rows = []
    for k in (1, 100, 1000):
        c = t["cases"][f"{k}_docs"]
        s = summarize(c["off_runs"], c["on_runs"])
        low, high = s["slowdown_quartiles_percent"]
        off_range = _slash([n(v, 1) for v in s["off_range"]])
        on_range = _slash([n(v, 1) for v in s["on_range"]])
        rows.append(
            [
                n(k),
                n(s["pairs"]),
                f"{n(s['off_messages_per_second'], 1)} ({off_range})",
                f"{n(s['on_messages_per_second'], 1)} ({on_range})",
                f"{s['slowdown_percent']:.1f}% ({low:.1f}% to {high:.1f}%)",
                s["verdict"],
                _dispatch_alone(c),
            ]
        )
    header = [
        "documents per unit of work",
        "off/on pairs",
        "off msg/s, median (min / max)",
        "on msg/s, median (min / max)",
        "slowdown, median of pairs (quartiles)",
        "verdict (goal 5%)",
        "dispatch alone: slowdown (quartiles), verdict",
    ]
    before, after = t.get("load_average_before"), t.get("load_average_after")
    machine_load = (
        f"load average {before[0]:.2f} before, {after[0]:.2f} after"
        if before and after
        else "load average not recorded"
    )
    cpus = t.get("cpus") or t.get("machine", {}).get("cpus")
    return _table(header, rows) + f"\nMeasured {t['started']} on {cpus} CPUs, {machine_load}.\n"


def _dispatch_alone(case: dict[str, Any]) -> str:
    d = case.get("dispatch_only")
    if d is None:
        return "-"
    low, high = d["slowdown_quartiles_percent"]
    return f"{d['slowdown_percent']:.1f}% ({low:.1f}% to {high:.1f}%), {d['verdict']}"


#: (method timed, the name it had in results written before issue 31, the column's label)
_PROFILE_PARTS = (
    ("_recheck", "_recheck", "save: re-check scan"),
    ("_append_documents", "_merge_documents", "save: commit"),
    ("send_pending", "send_pending", "dispatch: sends (wall)"),
    ("_send", "_send", "sends, summed over threads"),
    ("_append_marks", "_merge_watermarks", "watermark commits"),
)


def dispatch_profile() -> str:
    """``python -m benchmarks.dispatch --profile``: seconds inside each step, per case."""
    p = load("dispatch_profile")
    rows = []
    for name, c in p["sizes"].items():
        sec = c["seconds"]
        rows.append(
            [f"`{name}` ({c['rounds']} commits)"]
            + [f"{sec.get(k, sec.get(old, 0.0)):,.3f} s" for k, old, _ in _PROFILE_PARTS]
            + [
                f"{_sig(c['caller_ms_p50'])} ms",
                f"{n(c['messages_per_second'])} msg/s",
                f"{n(c['wall_messages_per_second'])} msg/s",
            ]
        )
    header = (
        ["case"]
        + [label for _, _, label in _PROFILE_PARTS]
        + ["caller p50", "dispatch-only", "whole loop"]
    )
    return _table(header, rows)


def dispatch_window() -> str:
    """The single-document ``watermark_window`` sweep of ``dispatch.json``."""
    sweep = load("dispatch")["window_sweep"]
    rows = [
        [
            f"`{w}`" + (" (inline)" if float(w) == 0 else ""),
            f"{_sig(c['caller_ms']['p50_ms'])} ms",
            f"{_sig(c['caller_ms']['p99_ms'])} ms",
            f"{n(c['wall_messages_per_second'], 1)} msg/s",
            f"{c['watermark_merges']} for {c['rounds']} commits",
        ]
        for w, c in sweep.items()
    ]
    header = [
        "watermark_window (s)",
        "caller p50",
        "caller p99",
        "whole loop",
        "watermark MERGEs of their own",
    ]
    return _table(header, rows)


def dispatch_before() -> str:
    """The dispatch figures before issue 19 (``dispatch_before_issue19.json``, quiet machine)."""
    c = load("dispatch_before_issue19")["cases"]
    rows = []
    for k in (1, 100, 1000):
        x = c[f"{k}_docs_coalesced"]
        rows.append(
            [
                n(k),
                f"{n(x['messages_per_second'], 1)} msg/s",
                f"{n(x['dispatch_ms']['mean_ms'], 1)} ms",
                f"{n(x['watermark_merge']['mean_ms'], 1)} ms",
                f"{n(x['save_ms']['mean_ms'], 1)} ms",
            ]
        )
    header = [
        "documents per unit of work",
        "dispatch-only",
        "dispatch per commit (mean)",
        "of which the watermark MERGE (mean)",
        "the caller's unit of work (mean)",
    ]
    return _table(header, rows)


RENDERERS = {
    "dispatch": dispatch,
    "dispatch-profile": dispatch_profile,
    "dispatch-before": dispatch_before,
    "dispatch-window": dispatch_window,
    "telemetry": telemetry,
}

"""The table-state results blocks (``benchmarks/results/table_state.json``, issue 47), for
``benchmarks.report``: docs/delta.md's tables and the README's performance row.

Until a full run has written the results file, each block says so and how to make it, instead of
a figure (the file is written by a run of about an hour on a quiet machine)."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.report_common import RESULTS, load, n, table

NAME = "table_state"
PENDING = (
    "_Not measured yet: `python -m benchmarks.table_state` writes "
    "`benchmarks/results/table_state.json`, then `python -m benchmarks.report` fills this in._\n"
)

LABELS = {
    "before": "a transaction per document, dated the save (before)",
    "expired": "**a transaction per document, born expired (chosen)**",
    "short_retention": "a transaction per document, the table's retention a minute",
    "per_bucket": "a transaction per bucket touched",
    "updates_only": "transactions for updates only",
}


def _data() -> dict[str, Any] | None:
    return load(NAME) if (RESULTS / f"{NAME}.json").exists() else None


def _kb(b: float) -> str:
    return f"{n(b / 1024)} kB"


def _mb(b: float) -> str:
    return f"{n(b / 1e6, 1)} MB"


def _yes(v: bool) -> str:
    return "yes" if v else "**no**"


def candidates(data: dict[str, Any] | None = None) -> str:
    d = data if data is not None else _data()
    if d is None or "candidates" not in d:
        return PENDING
    c = d["candidates"]
    rows = []
    for name, label in LABELS.items():
        r = c[name]
        cp, w = r["checkpoint"], r["two_writers"]
        rows.append(
            [
                label,
                f"{n(r['commit_p50_ms'], 1)} ms",
                f"{_kb(cp['bytes'])}, {n(cp['txn'])} transactions",
                f"{n(r['open_ms'], 1)} ms",
                f"{w['conflicts']} of {w['pairs']}",
                _yes(r["racing_updates_conflict"]),
                _yes(r["racing_creations_conflict"]),
            ]
        )
    header = [
        f"{n(c['commits'])} commits of {c['documents_per_commit']} new documents",
        "commit p50",
        "checkpoint after them",
        "open",
        "two writers of disjoint documents: the later one failed",
        "racing updates of a document conflict",
        "racing creations of an id conflict",
    ]
    return table(header, rows)


def _day_row(label: str, s: dict[str, Any]) -> list[str]:
    cp = s["checkpoint"]
    return [
        label,
        n(s["app_ids"]),
        _kb(cp["bytes"]),
        n(cp["txn"]),
        n(cp["remove"]),
        f"{n(s['open_ms'], 1)} ms",
    ]


def day(data: dict[str, Any] | None = None) -> str:
    d = data if data is not None else _data()
    if d is None or "day" not in d:
        return PENDING
    day_ = d["day"]
    chosen, before = day_["chosen"]["samples"], day_["before"]["samples"]
    picks = sorted({0, len(chosen) // 2, len(chosen) - 1})
    rows = [
        _day_row("table properties of `outbox migrate`, transactions born expired", chosen[i])
        for i in picks
    ]
    rows += [
        _day_row("the layout before (a day of transactions, a week of tombstones)", s)
        for s in before
    ]
    header = [
        "state",
        "app ids written",
        "checkpoint",
        "transactions in it",
        "tombstones in it",
        "opening the table",
    ]
    per_day = n(day_["app_ids_per_day"])
    stopped = (
        f"; the layout before stopped once its checkpoint passed 64 MB, at "
        f"{n(day_['before']['app_ids'])} app ids"
        if day_["before"]["app_ids"] < day_["app_ids_per_day"]
        else ""
    )
    return table(header, rows) + (
        f"\n{per_day} app ids in {day_['chosen']['rounds']} rounds of "
        f"{day_['commits_per_round']} commits ({n(day_['app_ids_per_commit'])} app ids and "
        f"{day_['tombstones_per_100_app_ids']} tombstones per 100 of them a commit){stopped}.\n"
    )


def _run_row(r: dict[str, Any]) -> list[str]:
    half = r["checkpoint_bytes_second_half"] or [0, 0]
    opens = [s["open_ms"] for s in r["samples"] if "open_ms" in s]
    ratio = r["last_over_first"]
    return [
        f"{r['store']}, from {n(r['seed_documents'])} documents, {n(r['minutes'])} min",
        f"{n(r['documents_created'])} ({n(r['commits_per_second'], 1)} commits/s)",
        f"{n(r['first_window_commit_p50_ms'], 1)} → {n(r['last_window_commit_p50_ms'], 1)} ms "
        f"(**{ratio:.2f}×**)"
        if ratio
        else "-",
        f"{_kb(half[0])}–{_kb(half[1])}, at most {n(r['checkpoint_txn_rows_max'])} transactions",
        f"{n(opens[0], 1)} → {n(opens[-1], 1)} ms" if opens else "-",
        "yes" if r["nothing_lost"] else "**no**",
    ]


def runs(data: dict[str, Any] | None = None) -> str:
    d = data if data is not None else _data()
    if d is None or "local" not in d:
        return PENDING
    done = [d[k] for k in ("local", "azure") if d.get(k)]
    window = n(done[0]["window_minutes"])
    header = [
        f"writer of new documents, {d['documents_per_unit']} a unit of work",
        "documents created",
        f"commit p50, first → last {window} min",
        "checkpoint, second half of the run",
        "opening the table, first → last sample",
        "every message consumed",
    ]
    return table(header, [_run_row(r) for r in done]) + (
        f"\n`log_retention` {n(d['log_retention_s'])} s; load average "
        f"{n(d['load_average_before'][0], 1)} before, {n(d['load_average_after'][0], 1)} after.\n"
    )


KINDS = ("data_live", "data_removed", "change_data", "commits", "checkpoints")


def disk(data: dict[str, Any] | None = None) -> str:
    d = data if data is not None else _data()
    if d is None or "local" not in d:
        return PENDING
    rows = []
    for r in (d[k] for k in ("local", "azure") if d.get(k)):
        end = r["end"]
        shares = [s["checkpoint_share"] for s in r["samples"] if "checkpoint_share" in s]
        rest = end["disk_bytes"] - sum(end["disk"].get(k, 0) for k in KINDS)
        live = end["disk"].get("data_live", 0)
        held = f"{n(end['disk'].get('data_removed', 0) / live, 1)}×" if live else "-"
        rows.append(
            [r["store"]]
            + [_mb(end["disk"].get(k, 0)) for k in KINDS]
            + [_mb(rest), _mb(end["disk_bytes"]), held, f"{n(max(shares) * 100, 1)}%"]
        )
    header = [
        "at the end",
        "live data files",
        "removed data files the log window holds",
        "change data",
        "commit files",
        "checkpoints",
        "the rest",
        "total",
        "removed data / live data",
        "checkpoints' largest share",
    ]
    return table(header, rows)


def readme_row(data: dict[str, Any] | None = None) -> list[str]:
    """The README performance table's row."""
    d = data if data is not None else _data()
    label = (
        "a writer creating 100 new documents per unit of work at full rate (one message each, "
        "immediate dispatch, a consumer and the rescuer beside it)"
    )
    if d is None or "local" not in d:
        return [
            label,
            "not measured yet (`python -m benchmarks.table_state`)",
            "`table_state.json`",
        ]
    r = d["local"]
    half = r["checkpoint_bytes_second_half"] or [0, 0]
    ratio = r["last_over_first"]
    p50 = (
        f"commit p50 {n(r['first_window_commit_p50_ms'], 1)} → "
        f"{n(r['last_window_commit_p50_ms'], 1)} ms (**{ratio:.2f}×**)"
        if ratio
        else "commit p50 -"
    )
    return [
        f"{label}, from {n(r['seed_documents'])} documents for {n(r['minutes'])} minutes",
        f"{p50}; checkpoint "
        f"{_kb(half[0])}–{_kb(half[1])} with {n(r['checkpoint_txn_rows_max'])} application "
        f"transactions after {n(r['documents_created'])} documents",
        "`table_state.json` `local`",
    ]


RENDERERS: dict[str, Callable[[], str]] = {
    "table-state-candidates": candidates,
    "table-state-day": day,
    "table-state-runs": runs,
    "table-state-disk": disk,
}

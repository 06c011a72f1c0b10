"""The document table's results blocks (``benchmarks/results/doc_table.json``, issue 31), for
``benchmarks.report``: the candidates, the product's costs per size, four writers, the
application transactions' state, and disk use."""

# ruff: noqa: RUF001  (the docs print multiplication signs: their typography)

from __future__ import annotations

from typing import Any

from benchmarks.report_common import load, n, table

CANDIDATE_LABELS = {
    "in_place": "in place (update MERGE, one file per bucket: the layout before)",
    "in_place_small_files": "in place, small files sorted by id",
    "versions_merge": "versions, insert-only MERGE",
    "versions_append_txn": "**versions, append + application transactions (chosen)**",
    "floor_append": "floor: plain append, no check",
}


def _sizes(d: dict[str, Any]) -> list[str]:
    return sorted(d["sizes"], key=int)


def candidates() -> str:
    d = load("doc_table")
    sizes = _sizes(d)
    rows = []
    for key, label in CANDIDATE_LABELS.items():
        c = [d["sizes"][s]["candidates"][key] for s in sizes]
        rows.append(
            [label]
            + [f"{n(x['commit_p50_ms'], 1)} ms" for x in c]
            + [f"{n(x['bytes_over_changed_rows'], 1)}×" for x in c]
        )
    header = (
        ["layout (raw deltalake)"]
        + [f"commit p50, {n(int(s))} docs" for s in sizes]
        + [f"bytes / changed rows, {n(int(s))}" for s in sizes]
    )
    return table(header, rows)


def outbox() -> str:
    d = load("doc_table")
    rows = []
    for s in _sizes(d):
        o = d["sizes"][s]["outbox"]
        f = o["rescuer_feed_pass"]
        u = o["upkeep"]
        rows.append(
            [
                n(int(s)),
                f"{n(o['get_many_100']['p50_ms'], 1)} ms",
                f"**{n(o['commit']['p50_ms'], 1)} ms** (p90 {n(o['commit']['p90_ms'], 1)})",
                f"{n(o['commit_bytes'] / 1000)} kB ({n(o['commit_bytes_over_changed_rows'], 1)}×)",
                f"{n(o['watermark']['p50_ms'], 1)} ms",
                f"{n(o['get_1']['p50_ms'], 1)} ms",
                f"{n(o['scan_pending']['p50_ms'], 1)} ms",
                f"{n(f['seconds'] * 1000)} ms ({n(f['change_rows'])} rows)",
                f"{n((u['fold_s'] + u['compact_s']) * 1000)} ms, {n(u['rows_removed'])} rows",
            ]
        )
    header = [
        "documents",
        "`get_many` 100",
        "commit",
        "bytes per commit (× changed rows)",
        "watermark",
        "`get` 1",
        "`scan_pending`",
        "rescuer feed pass",
        "fold + compaction after",
    ]
    return table(header, rows)


def writers() -> str:
    w = load("doc_table")["writers"]
    rows = []
    for key, label in (("alone", "writers alone"), ("with_folds", "with a fold every second")):
        r = w[key]
        folds = r.get("folds")
        rows.append(
            [
                label,
                n(r["commits"]),
                f"{n(r['retries'])} ({n(r['retries_per_commit'], 3)} per commit)",
                n(r["concurrency_errors"]),
                f"{n(r['commits_per_second'], 1)}",
                f"{n(r['commit_p50_ms'])} ms",
                "-"
                if folds is None
                else f"{folds['bucket_folds']} / {folds['bucket_folds_skipped']}",
            ]
        )
    header = [
        f"{w['writers']} processes, {n(w['documents'])} documents",
        "commits",
        "conflicts retried",
        "`ConcurrencyError`",
        "commits/s",
        "commit p50",
        "bucket folds done / skipped",
    ]
    return table(header, rows)


def txn_state() -> str:
    t = load("doc_table")["txn_state"]
    rows = [
        [
            label,
            f"{n(t[key]['checkpoint_bytes'] / 1000)} kB",
            f"{n(t[key]['open']['p50_ms'], 1)} ms",
            f"{n(t[key]['refresh']['p50_ms'], 1)} ms",
        ]
        for key, label in (
            ("without", "no application transactions"),
            ("with", f"{n(t['app_ids'])} app ids"),
        )
    ]
    return table(["table state", "checkpoint", "open the table", "refresh (one new commit)"], rows)


def disk() -> str:
    k = load("doc_table")["disk"]
    last = k["last"]
    rows = [
        [
            f"{n(k['seconds'] / 60)} min, {n(k['commits'])} commits of 100 over "
            f"{n(k['documents'])} documents; upkeep every {k['compact_every']} commits, "
            f"`log_retention` {n(k['log_retention_s'])} s",
            f"{n(k['max_disk_bytes'] / 1e6, 1)} MB",
            f"{n(last['disk_bytes'] / 1e6, 1)} MB on disk, "
            f"{n(last['live_bytes'] / 1e6, 1)} MB live, "
            f"{n(last['window_bytes'] / 1e6, 1)} MB in the window, {n(last['files'])} files",
            f"**{n(k['max_ratio_last_third'], 2)}×**",
        ]
    ]
    header = [
        "run",
        "most on disk",
        "at the end",
        "disk / (live + window), worst of the last third",
    ]
    return table(header, rows)


RENDERERS = {
    "doc-table-candidates": candidates,
    "doc-table-outbox": outbox,
    "doc-table-writers": writers,
    "doc-table-txn": txn_state,
    "doc-table-disk": disk,
}


def readme_rows() -> list[list[str]]:
    """The README performance table's lines for the document table at scale."""
    d = load("doc_table")
    sizes = _sizes(d)
    out = [d["sizes"][s]["outbox"] for s in sizes]
    before = [d["sizes"][s]["candidates"]["in_place"] for s in sizes]
    labels = " / ".join(n(int(s)) for s in sizes)
    w = d["writers"]["alone"]
    return [
        [
            f"a unit of work changing 100 random documents (`get_many`, change, send), in a table "
            f"of {labels} documents: the commit",
            "**"
            + " / ".join(f"{n(o['commit']['p50_ms'], 1)}" for o in out)
            + " ms p50**, writing "
            + " / ".join(f"{n(o['commit_bytes_over_changed_rows'], 1)}×" for o in out)
            + " the changed rows' bytes (the in-place layout before: "
            + " / ".join(f"{n(b['commit_p50_ms'])}" for b in before)
            + " ms, "
            + " / ".join(f"{n(b['bytes_over_changed_rows'])}×" for b in before)
            + ")",
            "`doc_table.json` `outbox`, `candidates`",
        ],
        [
            "the same unit of work's `get_many` of 100 documents",
            " / ".join(f"{n(o['get_many_100']['p50_ms'], 1)}" for o in out) + " ms p50",
            "`doc_table.json` `outbox`",
        ],
        [
            f"{d['writers']['writers']} writer processes on disjoint random documents of a "
            f"{n(d['writers']['documents'])}-document table",
            f"{n(w['retries_per_commit'], 3)} conflict retries per commit, "
            f"{n(w['concurrency_errors'])} `ConcurrencyError`",
            "`doc_table.json` `writers`",
        ],
    ]

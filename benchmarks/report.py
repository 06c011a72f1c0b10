"""Render the performance tables of README.md and docs/*.md from benchmarks/results/*.json.

    python -m benchmarks.report           # rewrite every block in place
    python -m benchmarks.report --check   # exit 1 if a committed block differs from its results

Why generated: a figure typed by hand drifts from the run it came from (the docs once quoted
numbers no results file held). Each block sits between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->``; NAME picks a renderer below, and everything between the markers is
overwritten. tests/test_docs_numbers.py fails when a block is stale, and when prose outside the
blocks quotes a measurement that no results file holds.
"""

# ruff: noqa: RUF001  (the docs print multiplication signs and en dashes: their typography)

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    report_console,
    report_devices,
    report_doc_table,
    report_kafka,
    report_object_store,
    report_readers,
    report_table_state,
)
from benchmarks.report_common import RESULTS, ROOT, load, n, table

__all__ = ["RESULTS", "ROOT", "documents", "main", "render"]

BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def ms(seconds: float, digits: int = 0) -> str:
    return f"{n(seconds * 1000, digits)} ms"


def _slash(values: list[str]) -> str:
    return " / ".join(values)


_table = table


# --- docs/performance.md, and the README's headline rows ---------------------------------------

#: The rows the README quotes (by their source cell), out of docs/performance.md's whole table.
HEADLINE_SOURCES = (
    "`write_path.json` `save_vs_raw_ratio`",
    "`doc_table.json` `outbox`, `candidates`",
    "`dispatch.json`",
    "`kafka.json`",
)


def performance() -> str:
    """docs/performance.md's table: every headline figure, one row each."""
    return _table(["what", "figure", "source"], performance_rows())


def readme_headline() -> str:
    """The README's few rows, the same cells as docs/performance.md's (picked by source)."""
    rows = {row[2]: row for row in performance_rows()}
    return _table(["what", "figure", "source"], [rows[s] for s in HEADLINE_SOURCES])


def performance_rows() -> list[list[str]]:
    w, d, q, r = load("write_path"), load("dispatch"), load("sql_queue"), load("rescuer")
    ratio = w["ratio"]
    rows: list[list[str]] = [
        [
            "unit of work (create + one message) vs the same save in raw deltalake calls "
            "(build the row, refresh the table the same way, read the id, append it with its "
            "application transaction), interleaved",
            f"**{ratio['save_vs_raw_ratio']:.2f}×** "
            f"({n(ratio['uow_create_and_send']['p50_ms'], 1)} vs "
            f"{n(ratio['raw_insert']['p50_ms'], 1)} ms p50, load average "
            f"{_slash([n(x, 1) for x in ratio['load_average_1m']])})",
            "`write_path.json` `save_vs_raw_ratio`",
        ],
        [
            "unit of work that reads the document first (get, change, send) vs the raw read and "
            "append of the same row",
            f"{ratio['update_vs_raw_ratio']:.2f}× "
            f"({n(ratio['uow_get_change_send']['p50_ms'], 1)} vs "
            f"{n(ratio['raw_update']['p50_ms'], 1)} ms)",
            "`update_vs_raw_ratio`",
        ],
    ]
    b = w["batches"]
    rows.append(
        [
            "batch saves: 1 / 100 / 1,000 documents per commit",
            _slash([n(b[k]["documents_per_second"]) for k in ("1", "100", "1000")])
            + " documents/s",
            "`batches`",
        ]
    )
    g = w["group_commit"]
    rows.append(
        [
            f"group commit, {g['threads']} threads saving one document each",
            f"{n(g['off']['units_per_second'], 1)} → {n(g['on']['units_per_second'], 1)} "
            f"units/s ({n(g['speedup'], 1)}×)",
            "`group_commit`",
        ]
    )
    none, every = w["growth_without_upkeep"], w["growth_with_compaction_every_100"]
    rows.append(
        [
            "1,000 commits (an update + a new document each), no upkeep",
            f"p50 {n(none['first_window_p50_ms'])} → {n(none['last_window_p50_ms'])} ms, "
            f"{n(none['windows'][0]['files'])} → {n(none['windows'][-1]['files'])} files",
            "`growth_without_upkeep`",
        ]
    )
    files = [x["files"] for x in every["windows"]]
    rows.append(
        [
            "the same with compaction every 100 commits",
            f"p50 {n(every['first_window_p50_ms'])} → {n(every['last_window_p50_ms'])} ms, "
            f"{min(files)}–{max(files)} files",
            "`growth_with_compaction_every_100`",
        ]
    )
    only, upkeep = w["long_run_compaction_only"], w["long_run_with_upkeep"]
    rows.append(
        [
            f"{n(only['commits'])} such commits from {n(only['seed_docs'] // 1000)}k documents, "
            "compaction only",
            f"p50 {n(only['first_window_p50_ms'])} → {n(only['last_window_p50_ms'])} ms per "
            f"1,000-commit window; the log grows to {n(only['windows'][-1]['log_files'])} files",
            "`long_run_compaction_only`",
        ]
    )
    p50s = [x["p50_ms"] for x in upkeep["windows"]]
    logs = [x["log_files"] for x in upkeep["windows"]]
    rows.append(
        [
            "the same with full upkeep (compaction + log trim, `log_retention` "
            f"{n(upkeep['log_retention_s'])} s)",
            f"**p50 {n(upkeep['first_window_p50_ms'])} → {n(upkeep['last_window_p50_ms'])} ms, "
            f"every window within {n(min(p50s))}–{n(max(p50s))} ms** (max/min "
            f"{n(upkeep['max_over_min_window_p50'], 2)}); log {n(min(logs))}–{n(max(logs))} files",
            "`long_run_with_upkeep`",
        ]
    )
    bk = w["buckets"]
    keys = sorted(bk, key=int)
    rows.append(
        [
            f"2 writer processes on disjoint documents, {_slash(keys)} buckets",
            f"{_slash([n(bk[k]['commits_per_second'], 1) for k in keys])} commits/s, "
            f"{_slash([str(bk[k]['commit_retries']) for k in keys])} conflict retries",
            "`buckets`",
        ]
    )
    rows += report_doc_table.readme_rows()
    rows += report_object_store.readme_rows()
    rows.append(report_table_state.readme_row())
    cases = [d["cases"][f"{k}_docs_coalesced"] for k in (1, 100, 1000)]
    rows.append(
        [
            "immediate dispatch, SQL transport on SQLite, 1 / 100 / 1,000 documents per unit of "
            "work",
            f"{_slash([n(c['messages_per_second']) for c in cases])} messages/s; p99 "
            f"commit→settled {_slash([_sig(c['p99_ms']) for c in cases])} ms; the caller's "
            f"unit of work p50 {_slash([_sig(c['caller_ms']['p50_ms']) for c in cases])} ms "
            "(watermarks coalesced off its path)",
            "`dispatch.json`",
        ]
    )
    for backend, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        rows.append(_queue_row(q[backend], label))
    rows += _rescuer_rows(r)
    rows += _spark_rows(load("spark_write"))
    rows += report_kafka.readme_rows()
    rows += report_devices.readme_rows()
    rows += report_readers.readme_rows()
    rows += report_console.readme_rows()
    return rows


def _spark_rows(sw: dict[str, Any]) -> list[list[str]]:
    ratio, disp, py = sw["ratio"], sw["dispatch"], sw["python_path_same_batch"]
    return [
        [
            f"Spark `SparkOutbox.apply` of {n(ratio['rows'])} changes vs a raw delta-spark MERGE "
            "of the same rows (validation + MERGE + finding the commit), median of "
            f"{ratio['rounds']}",
            f"{ratio['apply_over_raw_merge']:.2f}× (load average "
            f"{_slash([n(x, 1) for x in sw['load_average_1m']])})",
            "`spark_write.json` `apply_over_raw_merge`",
        ],
        [
            f"Spark apply of {n(disp['messages'])} messages, commit→settled on the SQL queue / "
            "the same batch through one Python unit of work",
            f"{n(disp['messages_per_second'])} / {n(py['messages_per_second'])} messages/s "
            f"({sw['dispatch_over_python_path']:.2f}×); reading the commit's change data "
            f"{n(disp['where_the_time_goes_s']['read_commit_changes'], 1)} s, sending "
            f"{n(disp['where_the_time_goes_s']['send_sql_queue'], 1)} s, watermark MERGE "
            f"{n(disp['where_the_time_goes_s']['watermark_merge'], 1)} s",
            "`spark_write.json` `dispatch`",
        ],
    ]


def spark_write() -> str:
    return _table(["what", "figure", "source"], _spark_rows(load("spark_write")))


def _sig(value: float) -> str:
    """Two significant figures for latencies that span 3 ms to 60 ms."""
    return n(value, 1) if value < 10 else n(value)


_QUEUE_KEYS = (
    "send_single_per_s",
    "send_batch100_per_s",
    "receive_complete_1_per_s",
    "receive_complete_4_per_s",
)


def _queue_row(b: dict[str, Any], label: str) -> list[str]:
    lat = b["queue"]["latency"]
    return [
        f"SQL queue on {label}: send single / batch of 100, receive+complete 1 / 4 receivers",
        f"{_slash([n(b['queue'][k]) for k in _QUEUE_KEYS])} msg/s, latency p50/p99 "
        f"{n(lat['p50_ms'], 1)}/{n(lat['p99_ms'], 1)} ms; ratio to a raw INSERT/SELECT/DELETE "
        f"floor {_slash([n(b['floor_over_queue'][k], 2) for k in _QUEUE_KEYS])}" + _scaling(b),
        "`sql_queue.json`",
    ]


def _scaling(b: dict[str, Any]) -> str:
    """Four receiving processes against one, beside the floor's (PostgreSQL only)."""
    scale = b.get("four_processes_over_one")
    if not scale:
        return ""
    procs = n(b["queue"]["receive_complete_4_processes_per_s"])
    return (
        f"; 4 receiving processes {procs} msg/s, **{n(scale['queue'], 2)}× one receiver** "
        f"(the floor {n(scale['floor'], 2)}×; goal 1.8×)"
    )


def _rescuer_rows(r: dict[str, Any]) -> list[list[str]]:
    sizes = {s["docs"]: s for s in r["sizes"]}
    big = sizes[1_000_000]
    many = r["many_commits"]
    return [
        [
            "rescuer, local engine, feed pass with 100 changed documents at 10k / 100k / 1M "
            "documents",
            f"{_slash([ms(sizes[k]['feed_pass_s']) for k in sorted(sizes)]).replace(' ms', '')}"
            f" ms (`feed_pass_growth_10k_to_1m` = {r['feed_pass_growth_10k_to_1m']:.2f}: flat)",
            "`rescuer.json`",
        ],
        [
            "rescuer, full sweep at 1M documents / Spark feed pass at 1M",
            f"{ms(big['sweep_pass_s'])} (`sweep_over_feed_at_1m` = "
            f"{r['sweep_over_feed_at_1m']:.2f}; it reads only control columns) / "
            f"{n(big['spark_pass_s'], 2)} s (a JVM job: {n(r['spark_over_local_at_1m'])}× the "
            "local pass)",
            "`rescuer.json`",
        ],
        [
            f"rescuer after {n(many['commits'])} small commits",
            f"a pass over all {n(many['commits'])} versions {n(many['pass_all_versions_s'], 1)} s "
            f"({n(many['versions_per_second_all'])} versions/s); over the last 100: "
            f"{ms(many['pass_last_100_versions_s'])}; window walk {ms(many['window_walk_s'])}; "
            f"open {ms(many['open_table_s'])} (deltalake wrote "
            f"{many['delta_checkpoint_files']} checkpoints)",
            "`rescuer.json` `many_commits`",
        ],
    ]


# --- docs --------------------------------------------------------------------------------------


def rescuer_sizes() -> str:
    r = load("rescuer")
    rows = [
        [
            f"{s['docs'] // 1000:,}k" if s["docs"] < 1_000_000 else "1M",
            ms(s["feed_pass_s"], 1),
            ms(s["sweep_pass_s"], 1),
            f"{n(s['spark_pass_s'], 2)} s",
            f"{n(s['spark_sweep_pass_s'], 2)} s",
            ms(s["store_read_100_ids_s"], 1),
        ]
        for s in r["sizes"]
    ]
    table = _table(
        [
            "docs",
            "feed pass (local)",
            "sweep pass (local)",
            "Spark feed pass",
            "Spark sweep",
            "`store.read` 100 ids",
        ],
        rows,
    )
    many = r["many_commits"]
    return (
        table
        + "\n"
        + f"- `feed_pass_growth_10k_to_1m` = **{r['feed_pass_growth_10k_to_1m']:.2f}** (goal "
        "≤ 1.5: the feed pass does not grow with the table).\n"
        + f"- `sweep_over_feed_at_1m` = **{r['sweep_over_feed_at_1m']:.2f}**; "
        f"`spark_over_local_at_1m` = {n(r['spark_over_local_at_1m'], 1)}.\n"
        + f"- After {n(many['commits'])} one-row commits ({n(many['write_s'])} s to write): "
        f"deltalake wrote {many['delta_checkpoint_files']} Delta checkpoints, opening the table "
        f"took {ms(many['open_table_s'])}, the window walk {ms(many['window_walk_s'])}, a feed "
        f"pass over the last 100 versions {ms(many['pass_last_100_versions_s'])} and over all of "
        f"them {n(many['pass_all_versions_s'], 1)} s "
        f"(**{n(many['versions_per_second_all'])} versions/s**).\n"
    )


def rescuer_planner() -> str:
    rows = [
        [
            f"{p['rows']:,}",
            ms(p["pyarrow_s"], 1),
            ms(p["polars_s"], 1),
            f"{n(p['polars_s'] / p['pyarrow_s'], 2)}×",
        ]
        for p in load("rescuer")["planner"]
    ]
    return _table(["change rows", "pyarrow", "polars", "polars / pyarrow"], rows)


def sql_queue() -> str:
    q = load("sql_queue")
    labels = (
        "send, single",
        "send, batches of 100",
        "receive + complete, 1 receiver",
        "receive + complete, 4 threads",
    )
    rows = []
    for key, label in zip(_QUEUE_KEYS, labels, strict=True):
        row = [label]
        for b in ("sqlite", "postgresql"):
            row += [
                f"{n(q[b]['queue'][key])}/s",
                f"{n(q[b]['floor'][key])}/s",
                f"{n(q[b]['floor_over_queue'][key], 2)}×",
            ]
        rows.append(row)
    procs = "receive_complete_4_processes_per_s"
    if all(procs in q[b]["queue"] for b in ("sqlite", "postgresql")):
        row = ["receive + complete, 4 processes"]
        for b in ("sqlite", "postgresql"):
            row.append(f"{n(q[b]['queue'][procs])}/s")
            if procs in q[b]["floor"]:  # the floor drains in processes on PostgreSQL only
                row += [f"{n(q[b]['floor'][procs])}/s", f"{n(q[b]['floor_over_queue'][procs], 2)}×"]
            else:
                row += ["", ""]
        rows.append(row)
        scale = q["postgresql"].get("four_processes_over_one")
        if scale:
            rows.append(
                [
                    "4 processes over 1 receiver",
                    "",
                    "",
                    "",
                    f"{n(scale['queue'], 2)}×",
                    f"{n(scale['floor'], 2)}×",
                    "",
                ]
            )
    lat = [q[b]["queue"]["latency"] for b in ("sqlite", "postgresql")]
    rows.append(
        [
            "end-to-end latency p50 / p99",
            f"{n(lat[0]['p50_ms'], 1)} / {n(lat[0]['p99_ms'], 1)} ms",
            "",
            "",
            f"{n(lat[1]['p50_ms'], 1)} / {n(lat[1]['p99_ms'], 1)} ms",
            "",
            "",
        ]
    )
    header = [
        f"{n(q['sqlite']['messages'])} messages",
        "SQLite queue",
        "SQLite floor",
        "floor/queue",
        "PostgreSQL queue",
        "PostgreSQL floor",
        "floor/queue",
    ]
    return _table(header, rows)


def sql_queue_profile() -> str:
    """``python -m benchmarks.sql_queue --profile LABEL``: each operation under cProfile, the
    code before and after issue 19 (docs/performance-queue.md)."""
    p = load("sql_queue_profile")
    rows = []
    for b, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        for op in ("send_batch100", "send_single", "receive_complete"):
            row = [f"{label}: {op.replace('_', ' ')}"]
            for when in ("before", "after"):
                r = p[when][b][op]
                shares = r["share_of_profiled_time_pct"]
                sa = shares.get("SQLAlchemy", 0.0)
                db = sum(v for k, v in shares.items() if k.startswith("driver and database"))
                row += [
                    f"{n(r['client_cpu_us_per_message_profiled'], 1)} µs",
                    n(r["statements_per_message"], 2),
                    f"{n(sa, 1)}% / {n(db, 1)}%",
                ]
            rows.append(row)
    header = [
        "operation",
        "before: client CPU per message",
        "statements per message",
        "SQLAlchemy / driver+database share",
        "after: client CPU per message",
        "statements per message",
        "SQLAlchemy / driver+database share",
    ]
    return _table(header, rows)


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


def checker_soak(name: str = "checker_soak") -> str:
    """The checker soak (``python -m benchmarks.checker_soak``): every count, its verdict."""
    c = load(name)
    t = c["total"]
    crashes = ", ".join(f"{k}: {n(v)}" for k, v in t["crashes"].items()) or "none"
    unfired = sum(len(v) for v in t["unfired_faults"].values())
    seeds = f"{n(c['seeds_run'])} run, {n(c['ok_seeds'])} ok, {n(len(c['failed_seeds']))} failed"
    if c["partial"]:
        seeds += f" (PARTIAL: {n(len(c['seeds_not_run']))} of {n(c['seeds_planned'])} not run)"
    rows = [
        ["command", f"`{c['command']}`, {c['chunks']} concurrent chunks"],
        ["code", f"commit `{c['commit'][:10]}`{c['commit'][40:]}"],
        ["seeds", seeds],
        ["messages committed", n(t["committed"])],
        [
            "deliveries (re-sends included)",
            f"{n(t['deliveries'])} ({n(t['duplicates'])} duplicates)",
        ],
        [
            "lost / out of order / phantom / mismatched re-send",
            _slash([n(t[k]) for k in ("lost", "out_of_order", "phantoms", "mismatched")]),
        ],
        [
            "failed saves / watermark regressions / unexpected rescue errors",
            _slash([n(t[k]) for k in ("saves_failed", "watermark_regressions", "rescue_errors")]),
        ],
        [
            "planned faults (crash points, SIGKILLs, stranded rounds)",
            f"{n(t['faults_planned'])}, {n(unfired)} unfired",
        ],
        ["SIGKILLs from the supervisor", n(t["sigkills_sent"])],
        ["process deaths and raised crash points", crashes],
        ["first deliveries only the rescuer can have caused", n(t["rescued_first_deliveries"])],
        [
            "rescue passes (interrupted on purpose / failed and retried)",
            f"{n(t['rescue_passes'])} ({n(t['rescue_passes_interrupted'])} / "
            f"{n(t['rescue_passes_failed'])})",
        ],
        [
            "optimistic-concurrency retries / Delta commit retries",
            _slash([n(t["occ_retries"]), n(t["commit_retries"])]),
        ],
        [
            "wall time",
            f"{n(c['wall_s'])} s (a seed: p50 {c['seed_duration_p50_s']:.1f} s, max "
            f"{c['seed_duration_max_s']:.1f} s, on a loaded 2-core machine)",
        ],
    ]
    return _table(["soak", "result"], rows)


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


RENDERERS: dict[str, Callable[[], str]] = {
    "performance": performance,
    "readme-headline": readme_headline,
    "rescuer-sizes": rescuer_sizes,
    "rescuer-planner": rescuer_planner,
    "sql-queue": sql_queue,
    "sql-queue-profile": sql_queue_profile,
    "dispatch": dispatch,
    "dispatch-profile": dispatch_profile,
    "dispatch-before": dispatch_before,
    "dispatch-window": dispatch_window,
    "spark-write": spark_write,
    "checker-soak": checker_soak,
    "telemetry": telemetry,
    "checker-soak-before-recreate": lambda: checker_soak("checker_soak_before_recreate"),
    **report_doc_table.RENDERERS,
    **report_object_store.RENDERERS,
    **report_kafka.RENDERERS,
    **report_devices.RENDERERS,
    **report_console.RENDERERS,
    **report_readers.RENDERERS,
    **report_table_state.RENDERERS,
}

#: The files whose blocks this script owns.
DOCUMENTS = ("README.md", "docs/*.md")


def documents() -> list[Path]:
    out: list[Path] = []
    for pattern in DOCUMENTS:
        out += sorted(ROOT.glob(pattern))
    return out


def render(text: str) -> str:
    """``text`` with every results block regenerated (an unknown NAME raises KeyError)."""

    def fill(m: re.Match[str]) -> str:
        return m.group(1) + RENDERERS[m.group(2)]() + m.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report stale blocks")
    args = ap.parse_args(argv)
    stale = []
    for path in documents():
        text = path.read_text()
        fresh = render(text)
        if fresh != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(fresh)
    verb = "stale" if args.check else "rewrote"
    for p in stale:
        print(f"{verb}: {p}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

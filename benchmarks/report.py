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
    report_dispatch,
    report_dispatch_cost,
    report_doc_table,
    report_goals,
    report_kafka,
    report_object_store,
    report_pipeline,
    report_queue,
    report_readers,
    report_small_writers,
    report_table_state,
    report_trace,
)
from benchmarks.report_common import RESULTS, ROOT, load, n, table
from benchmarks.report_common import sig as _sig
from benchmarks.report_common import slash as _slash
from benchmarks.report_queue import QUEUE_KEYS as _QUEUE_KEYS

__all__ = ["RESULTS", "ROOT", "documents", "main", "render"]

BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def ms(seconds: float, digits: int = 0) -> str:
    return f"{n(seconds * 1000, digits)} ms"


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
    rows.append(report_small_writers.readme_row())
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
    rows.append(report_pipeline.readme_row())
    rows.append(report_dispatch_cost.readme_row())
    for backend, label in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        rows.append(_queue_row(q[backend], label))
    rows.append(report_queue.consumer_row())
    rows += _rescuer_rows(r)
    rows += _spark_rows(load("spark_write"))
    rows += report_kafka.readme_rows()
    rows += report_devices.readme_rows()
    rows += report_readers.readme_rows()
    rows += report_console.readme_rows()
    rows.append(report_trace.readme_row())
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


RENDERERS: dict[str, Callable[[], str]] = {
    "performance": performance,
    "readme-headline": readme_headline,
    "rescuer-sizes": rescuer_sizes,
    "rescuer-planner": rescuer_planner,
    "spark-write": spark_write,
    "checker-soak": checker_soak,
    "checker-soak-before-recreate": lambda: checker_soak("checker_soak_before_recreate"),
    **report_queue.RENDERERS,
    **report_dispatch.RENDERERS,
    **report_dispatch_cost.RENDERERS,
    **report_doc_table.RENDERERS,
    **report_object_store.RENDERERS,
    **report_kafka.RENDERERS,
    **report_devices.RENDERERS,
    **report_console.RENDERERS,
    **report_readers.RENDERERS,
    **report_table_state.RENDERERS,
    **report_small_writers.RENDERERS,
    **report_trace.RENDERERS,
    **report_goals.RENDERERS,
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

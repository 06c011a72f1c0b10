"""Rescuer benchmark: does a feed pass stay flat as the table grows; what does a sweep cost?

    python -m benchmarks.rescuer            # 10k, 100k, 1M docs; local, sweep and Spark
    python -m benchmarks.rescuer --quick    # local engine at 10k and 100k, under a minute
    python -m benchmarks.rescuer --smoke    # every step of the full run at 200 and 1k docs,
                                            # 2-bucket tables
    python -m benchmarks.rescuer --smoke --spark-only   # the Spark passes alone, at 200 docs

Each table is built fast (one big append, CDF on), then 100 documents are changed in 10 MERGE
commits after the checkpoint. A pass starts from a fresh checkpoint at the build version, so
every repetition does the same work. The Spark passes run in a full run and in ``--smoke``
unless ``--no-spark`` (they reuse the process's SparkSession when it has one). tests/benchmarks
runs ``--smoke --no-spark`` in a process of its own and ``--smoke --spark-only`` (the Spark passes
and the local pass they are compared with, at the smallest size) on the Spark tests' session,
so the Spark tests' worker does not repeat the local steps.

A full run writes benchmarks/results/rescuer.json; ``--quick`` and ``--smoke`` write
rescuer.quick.json / rescuer.smoke.json into a fresh temporary folder, never into
benchmarks/results/ (rescuer-quick.json there is an earlier quick run), and ``--out DIR``
chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import (
    add_output_options,
    rescue_pass_since,
    results_dir,
    results_name,
)
from outbox.core.clock import ManualClock
from outbox.core.model import DocumentRow, bucket_of
from outbox.delta import schema as S
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from rescuer.cdf_local import LocalEngine, normalize, plan_arrow
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.planner import Engine, FeedWindow, PendingDocument, pending_from_rows
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink
from rescuer.window import find_window_end

BUCKETS = 16
#: ``--smoke``'s tables: two buckets, so the changes' commits write a file or two each, not up
#: to ten (a smoke run measures nothing; a Spark pass reads each file)
SMOKE_BUCKETS = 2
CHANGED = 100
DELAY = 15.0


def plan_polars(
    feed: pa.Table, window: FeedWindow
) -> tuple[int, int, int, tuple[PendingDocument, ...]]:
    """``cdf_local.plan_arrow`` in polars: the measured alternative (see docs/rescuer.md).

    Only this benchmark uses it; it asserts both give the same plan.
    """
    import polars as pl

    df = pl.from_arrow(feed)
    assert isinstance(df, pl.DataFrame)
    in_window = pl.col("_commit_version") <= window.end
    stats = df.select(
        in_window.sum().alias("rows"),
        pl.col("id").filter(in_window).n_unique().alias("docs"),
    ).row(0)
    change_rows = int(stats[0] or 0)
    documents = int(stats[1] or 0) if change_rows else 0
    images = df.filter(pl.col("_change_type") != "update_preimage").with_columns(
        (pl.col("_change_type") == "delete").alias("deleted"),
        (
            pl.col("_commit_version") * 2
            + pl.when(pl.col("_change_type") == "delete").then(0).otherwise(1)
        ).alias("_key"),
    )

    def latest(frame: pl.DataFrame) -> pl.DataFrame:
        return (
            frame.sort("_key")
            .group_by("id")
            .agg(
                pl.col("last_seq").last(),
                pl.col("dispatched_seq").last(),
                pl.col("incarnation").last(),  # a null is the latest image's value, kept as is
                pl.col("deleted").last(),
            )
        )

    pending = ~pl.col("deleted") & (pl.col("last_seq") > pl.col("dispatched_seq"))
    candidates = latest(images.filter(in_window)).filter(pending)
    current = latest(images.filter(pl.col("id").is_in(candidates["id"].implode()))).filter(pending)
    rows = current.select("id", "last_seq", "dispatched_seq", "incarnation").rows()
    return change_rows, documents, feed.num_rows - change_rows, pending_from_rows(rows)


def _median(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def build_table(path: Path, docs: int, buckets: int = BUCKETS) -> tuple[DeltaDocumentStore, int]:
    """``docs`` dispatched documents in one append, then 100 changed in 10 MERGE commits."""
    from deltalake import write_deltalake

    DeltaDocumentStore.create(str(path), buckets=buckets)
    ids = [f"doc-{i:07d}" for i in range(docs)]
    now = datetime.now(UTC)
    table = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "type": pa.array(["bench"] * docs, pa.string()),
            "version": pa.array([1] * docs, pa.int64()),
            "state": pa.array(["{}"] * docs, pa.string()),
            "last_seq": pa.array([1] * docs, pa.int64()),
            "dispatched_seq": pa.array([1] * docs, pa.int64()),
            "outbox": pa.array([[]] * docs, S.DOCUMENT_SCHEMA.field("outbox").type),
            "updated_at": pa.array([now] * docs, S.TS),
            "bucket": pa.array([bucket_of(i, buckets) for i in ids], pa.int32()),
            "incarnation": pa.nulls(docs, pa.string()),
            "deleted": pa.nulls(docs, pa.bool_()),
        },
        schema=S.DOCUMENT_SCHEMA,
    )
    write_deltalake(str(path), table, mode="append")
    store = DeltaDocumentStore(str(path))
    base = store.version()
    step = max(1, docs // CHANGED)
    changed = [ids[i * step] for i in range(CHANGED)]
    for k in range(10):
        read_at = store.refresh()
        batch = changed[k * 10 : (k + 1) * 10]
        store.save(
            [DocumentWrite(DocumentRow(i, "bench", 2, {}, 2, 1, []), 1, read_at) for i in batch]
        )
    return store, base


def _commit_time(store: DeltaDocumentStore) -> datetime:
    ts = int(store.delta_table.history(1)[0]["timestamp"])
    return datetime.fromtimestamp(ts / 1000, tz=UTC)


def run_pass(
    store: DeltaDocumentStore, engine: Engine, base: int, *, full: bool = False
) -> dict[str, Any]:
    now = _commit_time(store) + timedelta(seconds=DELAY + 1)
    rp = rescue_pass_since(store, base, engine=engine, now=now, delay=DELAY)
    report = rp.run(full=full)
    assert report.pending_documents == CHANGED, report.to_dict()
    return report.to_dict()


def measure_size(
    root: Path,
    docs: int,
    spark: Any | None,
    repeat: int,
    spark_repeat: int = 3,
    *,
    spark_warm: bool = True,
    buckets: int = BUCKETS,
) -> dict[str, Any]:
    path = root / f"t{docs}"
    t0 = time.perf_counter()
    store, base = build_table(path, docs, buckets)
    out: dict[str, Any] = {"docs": docs, "build_s": round(time.perf_counter() - t0, 2)}
    local = LocalEngine()
    run_pass(store, local, base)  # warm the handle
    feed_s, rep = _median(lambda: run_pass(store, local, base), repeat)
    out["feed_pass_s"] = round(feed_s, 4)
    out["feed_change_rows"] = rep["change_rows"]
    out["feed_versions"] = rep["versions_scanned"]
    sweep_s, _ = _median(lambda: run_pass(store, local, base, full=True), max(1, repeat - 2))
    out["sweep_pass_s"] = round(sweep_s, 4)
    read_s, _ = _median(
        lambda: store.read([f"doc-{i:07d}" for i in range(0, docs, docs // 100)]), 3
    )
    out["store_read_100_ids_s"] = round(read_s, 4)
    if spark is not None:
        from rescuer.cdf_spark import SparkEngine

        engine = SparkEngine(spark)
        if spark_warm:  # a JVM job's first run compiles; a smoke run measures nothing
            run_pass(store, engine, base)
        spark_s, _ = _median(lambda: run_pass(store, engine, base), spark_repeat)
        out["spark_pass_s"] = round(spark_s, 4)
        sweep_spark_s, _ = _median(lambda: run_pass(store, engine, base, full=True), 1)
        out["spark_sweep_pass_s"] = round(sweep_spark_s, 4)
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def measure_planners(rows: int) -> dict[str, Any]:
    """pyarrow vs polars on a synthetic feed: ``rows`` change rows over ``rows // 4`` ids."""
    ids = pa.array([f"doc-{i % (rows // 4):07d}" for i in range(rows)], pa.string())
    types = pa.array(
        [
            "insert" if i < rows // 4 else ("update_preimage", "update_postimage")[i % 2]
            for i in range(rows)
        ],
        pa.string(),
    )
    feed = normalize(
        pa.table(
            {
                "id": ids,
                "version": pa.array([1 + i // (rows // 4) for i in range(rows)], pa.int64()),
                "last_seq": pa.array([i % 7 for i in range(rows)], pa.int64()),
                "dispatched_seq": pa.array([i % 5 for i in range(rows)], pa.int64()),
                # a re-created document's images carry a new incarnation; older rows have none
                "incarnation": pa.array(
                    [None if i % 3 else f"inc-{i % 2}" for i in range(rows)], pa.string()
                ),
                "_change_type": types,
                "_commit_version": pa.array([1 + i // 100 for i in range(rows)], pa.int64()),
            }
        )
    )
    last = 1 + (rows - 1) // 100
    window = FeedWindow(0, max(1, last - 10), last)
    a_s, a = _median(lambda: plan_arrow(feed, window), 5)
    p_s, p = _median(lambda: plan_polars(feed, window), 5)
    assert a == p, "pyarrow and polars plans differ"
    return {"rows": rows, "pyarrow_s": round(a_s, 5), "polars_s": round(p_s, 5)}


def measure_many_commits(root: Path, commits: int) -> dict[str, Any]:
    """``commits`` one-row appends (new ids), then: open, window walk, and a pass over them all."""
    from deltalake import DeltaTable, write_deltalake

    path = root / "many"
    DeltaDocumentStore.create(str(path), buckets=BUCKETS)
    now = datetime.now(UTC)
    t0 = time.perf_counter()
    for i in range(commits):
        doc = f"m-{i:06d}"
        row = DocumentRow(doc, "bench", 1, {}, 1, 0 if i % 100 == 0 else 1, [], now)
        write_deltalake(
            str(path), S.table_from_rows([(row, bucket_of(doc, BUCKETS))], extra={}), mode="append"
        )
    write_s = time.perf_counter() - t0
    checkpoints = sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet"))
    open_s, _ = _median(lambda: DeltaTable(str(path)), 3)
    store = DeltaDocumentStore(str(path))
    end = _commit_time(store) + timedelta(seconds=DELAY + 1)
    walk_s, _ = _median(
        lambda: find_window_end(store.delta_table, now=end, delay=DELAY, floor=0), 3
    )
    local = LocalEngine()
    latest = store.version()

    def pass_from(base: int) -> dict[str, Any]:
        checkpoints_store = InMemoryCheckpointStore()
        checkpoints_store.write(
            store.uri,
            "b",
            expected_generation=None,
            version=base,
            at=now,
            details={"table_id": store.table_id},
        )
        rp = RescuePass(
            store,
            local,
            checkpoints_store,
            InMemorySink(),
            clock=ManualClock(end),
            delay=DELAY,
            name="b",
        )
        return rp.run().to_dict()

    last100_s, _ = _median(lambda: pass_from(max(0, latest - 100)), 3)
    all_s, rep = _median(lambda: pass_from(0), 1)
    out = {
        "commits": commits,
        "write_s": round(write_s, 1),
        "delta_checkpoint_files": len(checkpoints),
        "open_table_s": round(open_s, 4),
        "window_walk_s": round(walk_s, 4),
        "pass_last_100_versions_s": round(last100_s, 4),
        "pass_all_versions_s": round(all_s, 3),
        "versions_per_second_all": round(rep["versions_scanned"] / all_s, 1),
        "pending_found_all": rep["pending_documents"],
    }
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def _label(n: int) -> str:
    """1_000_000 -> "1m", 100_000 -> "100k", 200 -> "200": the sizes in the results' keys."""
    for unit, suffix in ((1_000_000, "m"), (1_000, "k")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="local engine, 10k and 100k only")
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument(
        "--spark-only",
        action="store_true",
        help="with --smoke: the Spark passes alone, at the smallest size (and the local pass "
        "they are compared with); --smoke --no-spark runs the rest",
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    if args.spark_only and (not args.smoke or args.no_spark):
        parser.error("--spark-only goes with --smoke, and not with --no-spark")
    # table sizes, planner feed rows, repetitions, commits of the many-commits run (0: none)
    sizes, planner_rows, repeat, commits = (
        ([200, 1_000], [400, 2_000], 2, 30)
        if args.smoke
        else ([10_000, 100_000], [1_000, 100_000, 1_000_000], 5, 0)
        if args.quick
        else ([10_000, 100_000, 1_000_000], [1_000, 100_000, 1_000_000], 5, args.commits)
    )
    if args.spark_only:
        sizes, planner_rows, commits = sizes[:1], [], 0
    spark = None
    if not args.quick and not args.no_spark:
        from rescuer.cdf_spark import find_jars, get_spark

        jars = find_jars() or sorted(str(p) for p in Path("/tmp/dj").glob("*.jar"))
        spark = get_spark(jars=jars)
    root = Path(tempfile.mkdtemp(prefix="rescuer-bench-"))
    results: dict[str, Any] = {
        "benchmark": "rescuer",
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "changed_docs": CHANGED,
        "started_at": datetime.now(UTC).isoformat(),
    }
    if args.smoke:
        results["smoke"] = True
    try:
        # --smoke: the Spark passes at the largest size only, once each and unwarmed (each is
        # a JVM job of seconds)
        spark_at = set(sizes[-1:] if args.smoke else sizes)
        spark_repeat = 1 if args.smoke else 3
        results["sizes"] = [
            measure_size(
                root,
                n,
                spark if n in spark_at else None,
                repeat,
                spark_repeat,
                spark_warm=not args.smoke,
                buckets=SMOKE_BUCKETS if args.smoke else BUCKETS,
            )
            for n in sizes
        ]
        results["planner"] = [measure_planners(n) for n in planner_rows]
        by = {r["docs"]: r for r in results["sizes"]}
        small, big = by[sizes[0]], by[sizes[-1]]
        span = f"{_label(small['docs'])}_to_{_label(big['docs'])}"
        key = _label(big["docs"])
        if len(sizes) > 1:
            growth = round(big["feed_pass_s"] / small["feed_pass_s"], 2)
            results[f"feed_pass_growth_{span}"] = growth
        results[f"sweep_over_feed_at_{key}"] = round(big["sweep_pass_s"] / big["feed_pass_s"], 2)
        if "spark_pass_s" in big:
            results[f"spark_over_local_at_{key}"] = round(
                big["spark_pass_s"] / big["feed_pass_s"], 1
            )
        if commits:
            results["many_commits"] = measure_many_commits(root, commits)
            results["versions_per_second"] = results["many_commits"]["versions_per_second_all"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["finished_at"] = datetime.now(UTC).isoformat()
    stem = results_name("rescuer", quick=args.quick, smoke=args.smoke)
    out = results_dir(args.out, quick=args.quick or args.smoke) / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(
        json.dumps({k: v for k, v in results.items() if not isinstance(v, list | dict)}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

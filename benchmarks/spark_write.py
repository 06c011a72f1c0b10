"""Spark write path: ``SparkOutbox.apply`` against a raw delta-spark MERGE, and dispatch throughput.

    python -m benchmarks.spark_write --quick   # 1,000-row ratio, 10,000 messages (< 3 min)
    python -m benchmarks.spark_write --smoke   # 20-row ratio (1 round, no warm-up), 50 messages
    python -m benchmarks.spark_write           # 10,000-row ratio, 100,000 messages

* ``apply_over_raw_merge``: the write part of ``apply`` (validation job + MERGE + finding the
  commit) over a raw delta-spark MERGE (``whenMatchedUpdateAll``/``whenNotMatchedInsertAll``) of
  the same rows, already in table shape, into a table of the same layout; median of the rounds,
  same run. Goal <= 1.3.
* ``messages_per_second``: one apply of a batch with that many messages (one per document),
  commit -> settled (reading the commit's change data, sending through the SQL-queue transport,
  one watermark MERGE), with where the time goes; ``python_path_same_batch`` is its floor: the
  same batch through one Python unit of work and its immediate dispatch, same run.

A full run writes benchmarks/results/spark_write.json; ``--quick`` and ``--smoke`` write
spark_write.quick.json / spark_write.smoke.json into a fresh temporary folder, never into
benchmarks/results/, and ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
It uses the process's SparkSession when it has one (with Delta), else starts a local one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save

CHANGES = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string>>"
)


def _changes(spark: Any, n: int, round_no: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.concat(F.lit("doc-"), F.col("id").cast("string")).alias("id"),
        F.lit("shipment").alias("type"),
        F.concat(F.lit('{"round":'), F.lit(round_no), F.lit("}")).alias("state"),
        F.lit(None).cast("long").alias("expected_version"),
        F.array(
            F.struct(F.lit("Scanned").alias("type"), F.lit('{"hub":"AMS"}').alias("body"))
        ).alias("messages"),
    )


def _raw_source(spark: Any, n: int, round_no: int, buckets: int) -> Any:
    """The same rows already in table shape: what a hand-written MERGE would write."""
    from pyspark.sql import functions as F

    doc_id = F.concat(F.lit("doc-"), F.col("id").cast("string"))

    def required(c: Any) -> Any:  # the table's element fields are NOT NULL
        return F.coalesce(c, F.lit(""))

    msg = F.struct(
        F.coalesce(F.lit(1).cast("long"), F.lit(0).cast("long")).alias("seq"),
        required(F.sha2(doc_id, 256)).alias("message_id"),
        required(F.lit("shipments")).alias("destination"),
        required(F.lit("Scanned")).alias("type"),
        required(F.lit('{"hub":"AMS"}')).alias("body"),
        F.lit("text/plain").alias("content_type"),
        F.lit(None).cast("string").alias("headers"),
        doc_id.alias("ordering_key"),
        F.lit(None).cast("string").alias("correlation_id"),
        F.lit(None).cast("timestamp").alias("deliver_at"),
        F.current_timestamp().alias("created_at"),
    )
    return spark.range(n).select(
        doc_id.alias("id"),
        F.lit("shipment").alias("type"),
        F.lit(round_no + 1).cast("long").alias("version"),
        F.concat(F.lit('{"round":'), F.lit(round_no), F.lit("}")).alias("state"),
        F.lit(1).cast("long").alias("last_seq"),
        F.lit(0).cast("long").alias("dispatched_seq"),
        F.array(msg).alias("outbox"),
        F.current_timestamp().alias("updated_at"),
        (F.crc32(doc_id) % buckets).cast("int").alias("bucket"),
        F.lit(None).cast("string").alias("incarnation"),
        F.lit(False).alias("deleted"),  # the table's schema version 3 column (a live document)
    )


def bench_ratio(
    spark: Any, base: Path, rows: int, rounds: int, *, warm: bool = True
) -> dict[str, Any]:
    from delta.tables import DeltaTable

    from outbox.app.spark import SparkOutbox

    sob = SparkOutbox(
        spark, base / "ours", transport="memory", compact_every=0, default_destination="shipments"
    )
    raw_uri = str(base / "raw")
    from outbox.delta.store import DeltaDocumentStore

    DeltaDocumentStore.create(raw_uri, buckets=sob.store.buckets)
    raw = DeltaTable.forPath(spark, raw_uri)
    in_list = ", ".join(str(b) for b in range(sob.store.buckets))
    ours: list[float] = []
    theirs: list[float] = []
    parts: list[dict[str, float]] = []
    # round 0 warms both up (and creates the rows); a smoke run measures nothing and skips it
    for r in range(rounds + warm):
        t = time.perf_counter()
        (
            raw.alias("t")
            .merge(
                _raw_source(spark, rows, r, sob.store.buckets).alias("s"),
                f"t.bucket IN ({in_list}) AND t.bucket = s.bucket AND t.id = s.id",
            )
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        raw_s = time.perf_counter() - t
        result = sob.apply(_changes(spark, rows, r), dispatch="deferred")
        write_s = sum(
            result.timings.get(k, 0.0) for k in ("validate_s", "merge_s", "commit_lookup_s")
        )
        if r or not warm:
            theirs.append(raw_s)
            ours.append(write_s)
            parts.append({k: round(v, 3) for k, v in result.timings.items()})
    sob.close()
    return {
        "rows": rows,
        "rounds": rounds,
        "raw_merge_s": [round(x, 3) for x in theirs],
        "apply_write_s": [round(x, 3) for x in ours],
        "apply_parts_s": parts,
        "apply_over_raw_merge": round(statistics.median(ours) / statistics.median(theirs), 3),
    }


def bench_dispatch(spark: Any, base: Path, messages: int) -> dict[str, Any]:
    from outbox.app.spark import SparkOutbox

    sob = SparkOutbox(
        spark,
        base / "dispatch",
        transport="sql",
        compact_every=0,
        default_destination="shipments",
        max_in_flight=8,
    )
    result = sob.apply(_changes(spark, messages, 0))
    sob.close()
    t = result.timings
    report = result.dispatch
    settled_s = t.get("dispatch_s", float("nan"))
    return {
        "messages": result.messages,
        "ok": bool(report is not None and report.ok),
        "commit_to_settled_s": round(settled_s, 3),
        "messages_per_second": round(result.messages / settled_s, 1) if settled_s else None,
        "where_the_time_goes_s": {
            "read_commit_changes": round(t.get("read_changes_s", 0.0), 3),
            "send_sql_queue": round(
                settled_s
                - t.get("read_changes_s", 0.0)
                - (report.watermark_seconds if report else 0.0),
                3,
            ),
            "watermark_merge": round(report.watermark_seconds if report else 0.0, 3),
        },
        "apply_parts_s": {k: round(v, 3) for k, v in t.items()},
    }


def bench_python_path(base: Path, messages: int) -> dict[str, Any]:
    """The floor for ``messages_per_second``: the same batch (one message per document, one
    commit) through the Python write path's unit of work and immediate dispatch, same run.
    Commit -> watermark written, as the Spark figure (its dispatch_s) counts it."""
    from outbox.app.facade import Outbox

    with Outbox.open(
        base / "python", default_destination="shipments", transport="sql", compact_every=0
    ) as ob:
        runtime = ob.runtime
        with ob.unit_of_work() as uow:  # warm up: table, queue, connection pool, thread pool
            uow.create("warm-up", type="shipment").send("Created", {"i": 0})
        runtime.metrics.reset()
        t0 = time.perf_counter()
        with ob.unit_of_work() as uow:
            for i in range(messages):
                uow.create(f"doc-{i}", type="shipment", state={"round": 0}).send(
                    "Scanned", {"hub": "AMS"}
                )
        total_s = time.perf_counter() - t0
        settled_s = list(runtime.metrics.dispatch_latency)[-1]
        sent = runtime.metrics["messages_sent"]
    return {
        "messages": sent,
        "unit_of_work_s": round(total_s, 3),
        "commit_to_settled_s": round(settled_s, 3),
        "messages_per_second": round(sent / settled_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, under 3 minutes")
    add_output_options(ap)
    args = ap.parse_args(argv)
    from rescuer.cdf_spark import get_spark

    rows, rounds, messages = (
        (20, 1, 50) if args.smoke else (1_000, 2, 10_000) if args.quick else (10_000, 3, 100_000)
    )
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    spark = get_spark()
    spark_start = time.perf_counter() - started
    base = Path(tempfile.mkdtemp(prefix="spark-write-"))
    try:
        ratio = bench_ratio(spark, base, rows, rounds, warm=not args.smoke)
        dispatch = bench_dispatch(spark, base, messages)
        python_path = bench_python_path(base, messages)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    import pyspark

    out = {
        "quick": args.quick,
        "spark": {
            "pyspark": pyspark.__version__,
            "master": spark.sparkContext.master,
            "session_start_s": round(spark_start, 1),
        },
        "apply_over_raw_merge": ratio["apply_over_raw_merge"],
        "messages_per_second": dispatch["messages_per_second"],
        "ratio": ratio,
        "dispatch": dispatch,
        "python_path_same_batch": python_path,
        "dispatch_over_python_path": round(
            dispatch["messages_per_second"] / python_path["messages_per_second"], 2
        ),
        "took_s": round(time.perf_counter() - started, 1),
        # the machine is shared: a ratio measured at load 3 on 2 cores is not one at load 0
        "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }
    path = save(args, "spark_write", out)
    print(
        f"apply_over_raw_merge={out['apply_over_raw_merge']} "
        f"messages_per_second={out['messages_per_second']} -> {path}"
    )


if __name__ == "__main__":
    main()

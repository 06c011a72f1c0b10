"""Spark at scale: one ``SparkOutbox.apply`` of a large batch, sent to Kafka from the executors.

    python -m benchmarks.spark_kafka            # 1,000,000 messages, local[1] and local[2]
    python -m benchmarks.spark_kafka --quick    # 100,000 messages, local[2]
    python -m benchmarks.spark_kafka --smoke    # 20 messages, no warm-up, this process's session

Each core count runs in its own process (a SparkSession's master is fixed when it starts), on a
throwaway Kafka broker (``testkit.kafka``, full JIT) shared by the runs:

* ``spark``: one apply of ``--messages`` documents with one message each
  (``send_from="executors"``); ``messages_per_second`` is messages / commit -> settled (the
  executors read the commit's change feed and send, the driver writes the marks in one append:
  ``timings["dispatch_s"]``); the MERGE itself is reported apart (``merge_s``);
* ``python_path``: the Python ``Outbox`` on the same broker, one unit of work of as many
  documents (``--python-docs`` to change it) with one message each, commit -> every record
  acknowledged (its dispatch time): the floor the Spark figure is compared with, same run;
* ``before``: the committed ``spark_write.json`` figure (the driver sending to the SQL queue).

A full run writes ``benchmarks/results/spark_kafka.json``; ``--quick`` and ``--smoke`` write
into a fresh temporary folder, never into benchmarks/results/ (benchmarks/common.py says the
rule).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, add_output_options, save


def _changes(spark: Any, n: int, prefix: str = "doc-") -> Any:
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.concat(F.lit(prefix), F.col("id").cast("string")).alias("id"),
        F.lit("shipment").alias("type"),
        F.lit('{"status":"created"}').alias("state"),
        F.lit(None).cast("long").alias("expected_version"),
        F.array(
            F.struct(F.lit("Scanned").alias("type"), F.lit('{"hub":"AMS"}').alias("body"))
        ).alias("messages"),
    )


def _topic(bootstrap: str, partitions: int = 8) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)
    return name


def run_spark(spark: Any, bootstrap: str, messages: int, *, warm: bool = True) -> dict[str, Any]:
    from outbox.app.spark import SparkOutbox

    topic = _topic(bootstrap)
    ws = Path(tempfile.mkdtemp(prefix="outbox-bench-spark-kafka-"))
    sob = SparkOutbox(
        spark,
        ws,
        transport="kafka",
        kafka_bootstrap_servers=bootstrap,
        default_destination=topic,
        compact_every=0,
        send_from="executors",
    )
    try:
        if warm:  # the executors' Python workers, the producer (a smoke run measures nothing)
            sob.apply(_changes(spark, 10, "warm-"))
        t0 = time.perf_counter()
        result = sob.apply(_changes(spark, messages))
        total = time.perf_counter() - t0
    finally:
        sob.close()
    assert result.dispatch is not None
    assert result.dispatch.messages_sent == messages, result.dispatch.messages_sent
    assert result.dispatch.failed == []
    t = result.timings
    return {
        "master": spark.sparkContext.master,
        "messages": messages,
        "messages_per_second": round(messages / t["dispatch_s"], 1),
        "apply_messages_per_second": round(messages / total, 1),
        "timings_s": {k: round(v, 3) for k, v in t.items()},
    }


def run_python(bootstrap: str, docs: int) -> dict[str, Any]:
    from outbox.app.facade import Outbox

    topic = _topic(bootstrap)
    ws = Path(tempfile.mkdtemp(prefix="outbox-bench-python-kafka-"))
    with Outbox.open(
        ws, transport="kafka", kafka_bootstrap_servers=bootstrap, default_destination=topic
    ) as ob:
        with ob.unit_of_work() as uow:
            uow.create("warm-up", type="Shipment").send("Scanned", {"hub": "AMS"})
        ob.runtime.metrics.reset()
        with ob.unit_of_work() as uow:
            for i in range(docs):
                doc = uow.create(f"doc-{i}", type="Shipment", state={"status": "created"})
                doc.send("Scanned", {"hub": "AMS"})
        dispatch_s = sum(ob.runtime.metrics.dispatch_latency)
        assert ob.runtime.metrics["messages_sent"] == docs
    return {"messages": docs, "messages_per_second": round(docs / dispatch_s, 1)}


def _child(args: argparse.Namespace) -> None:
    """One core count: its own SparkSession, its result as JSON on stdout."""
    from rescuer.cdf_spark import get_spark

    spark = get_spark(master=f"local[{args.child}]")
    print(json.dumps(run_spark(spark, args.bootstrap, args.messages)))


def main(argv: list[str] | None = None, spark: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--python-docs", type=int)
    parser.add_argument("--bootstrap")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    add_output_options(parser)
    args = parser.parse_args(argv)
    args.messages = args.messages or (20 if args.smoke else 100_000 if args.quick else 1_000_000)
    if args.child:
        _child(args)
        return
    python_docs = args.python_docs or args.messages  # the same batch: the same size of work
    from testkit.kafka import KafkaBroker

    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = KafkaBroker(heap="1g", quick_start=args.smoke)
        bootstrap = broker.start()
    runs: dict[str, Any] = {}
    try:
        if args.smoke or spark is not None:
            if spark is None:
                from rescuer.cdf_spark import get_spark

                spark = get_spark()
            runs["session"] = run_spark(spark, bootstrap, args.messages, warm=not args.smoke)
        else:
            for cores in (1,) * (not args.quick) + (2,):
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.spark_kafka",
                        "--child",
                        str(cores),
                        "--bootstrap",
                        bootstrap,
                        "--messages",
                        str(args.messages),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                runs[f"local[{cores}]"] = json.loads(out.stdout.strip().splitlines()[-1])
        python = run_python(bootstrap, python_docs)
    finally:
        if broker is not None:
            broker.cleanup()
    before = json.loads((RESULTS / "spark_write.json").read_text())["messages_per_second"]
    best = max(r["messages_per_second"] for r in runs.values())
    data = {
        "messages": args.messages,
        "runs": runs,
        "python_path": python,
        "before_spark_write_messages_per_second": before,
        "over_before": round(best / before, 2),
        "over_python_path": round(best / python["messages_per_second"], 2),
        "meets_goal": best >= 2 * before and best >= python["messages_per_second"],
    }
    path = save(args, "spark_kafka", data)
    print(
        f"Spark to Kafka: {best:,.0f} msg/s ({data['over_before']}x before, "
        f"{data['over_python_path']}x the Python path) -> {path}"
    )


if __name__ == "__main__":
    main()

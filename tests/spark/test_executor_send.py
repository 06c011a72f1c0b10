"""Spark sends from the executors (``SparkOutbox(send_from="executors")``): to a real Kafka
broker and to the SQL queue on a real PostgreSQL, after the commit only, a key stopping at its
first failure, and the driver writing the watermarks in one append."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatcher.kafka.mapping import record_of
from outbox.app.facade import Outbox
from outbox.testing.crash_points import CrashSpec
from testkit.kafka import KafkaBroker, read_records

pytestmark = pytest.mark.spark

CHANGES = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string, ordering_key:string, "
    "headers:map<string,string>>>"
)


def _changes(spark: Any, n: int, per_doc: int = 2, key: str | None = None) -> Any:
    rows = [
        (
            f"doc-{i}",
            "Order",
            json.dumps({"i": i}),
            None,
            [
                ("Placed", json.dumps({"i": i, "k": k}), key, {"tenant": "t1"})
                for k in range(per_doc)
            ],
        )
        for i in range(n)
    ]
    return spark.createDataFrame(rows, CHANGES)


def _sob(spark: Any, ws: Path, **settings: Any) -> Any:
    from outbox.app.spark import SparkOutbox

    settings.setdefault("buckets", 4)
    return SparkOutbox(spark, ws, compact_every=0, **settings)


def _on_kafka(kafka: KafkaBroker, topic: str) -> dict[str, Any]:
    """The settings of a workspace whose messages go to ``topic`` on the test broker."""
    return {
        "transport": "kafka",
        "kafka_bootstrap_servers": kafka.bootstrap,
        "default_destination": topic,
    }


def test_executors_send_to_kafka_after_the_commit_and_the_driver_writes_the_marks(
    spark: Any, tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    sob = _sob(spark, tmp_path / "ws", **_on_kafka(kafka, topic))
    try:
        assert sob.send_from == "executors"
        result = sob.apply(_changes(spark, 50))
    finally:
        sob.close()
    assert result.messages == 100
    assert result.dispatch is not None
    assert result.dispatch.messages_sent == 100
    assert result.dispatch.failed == []
    assert "executor_send_s" in result.timings
    records = [record_of(r) for r in read_records(kafka.bootstrap, topic)]
    assert len(records) == 100
    for i in range(50):
        mine = [json.loads(r.body)["k"] for r in records if r.session_id == f"doc-{i}"]
        assert mine == [0, 1], "a document's messages in seq order on its key's partition"
    assert records[0].headers["tenant"] == "t1"
    with Outbox.open(tmp_path / "ws", transport="memory") as ob:
        assert ob.store.scan_pending().num_rows == 0, "one append of marks covered every document"


def test_a_key_that_fails_stops_there_and_its_documents_stay_pending_with_a_retry_command(
    spark: Any, tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    """One topic is missing: its messages fail, the documents keep them pending (their
    watermark below the first failure) and get a retry command; the others are marked."""
    from pyspark.sql import functions as F

    sob = _sob(spark, tmp_path / "ws", **_on_kafka(kafka, topic))
    try:
        good = _changes(spark, 3)
        bad = (
            _changes(spark, 2)
            .withColumn("id", F.concat(F.lit("bad-"), F.col("id")))
            .withColumn(
                "messages",
                F.expr(
                    "transform(messages, m -> named_struct('type', m.type, 'body', m.body, "
                    "'ordering_key', m.ordering_key, 'headers', m.headers, "
                    "'destination', 'no-such-topic'))"
                ),
            )
        )
        result = sob.apply(good.unionByName(bad, allowMissingColumns=True))
        queued = sob.runtime.queue.peek(sob.settings.command_queue, 10)  # type: ignore[attr-defined]
    finally:
        sob.close()
    assert result.dispatch is not None
    assert sorted(result.dispatch.failed) == ["bad-doc-0", "bad-doc-1"]
    assert result.dispatch.messages_sent == 6
    assert sorted(json.loads(m.body)["id"] for m in queued) == ["bad-doc-0", "bad-doc-1"]
    with Outbox.open(tmp_path / "ws", transport="memory") as ob:
        pending = sorted(ob.store.scan_pending().column("id").to_pylist())
    assert pending == ["bad-doc-0", "bad-doc-1"]


def test_nothing_is_sent_when_the_commit_fails(
    spark: Any, tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    """The partitions read the commit's change feed: a MERGE that fails sends nothing."""
    from outbox.core.errors import OutboxError

    sob = _sob(spark, tmp_path / "ws", **_on_kafka(kafka, topic))
    try:
        original = sob._merge

        def failing(*a: Any, **k: Any) -> Any:
            raise OutboxError("the MERGE failed")

        sob._merge = failing
        with pytest.raises(OutboxError, match="the MERGE failed"):
            sob.apply(_changes(spark, 5))
        sob._merge = original
    finally:
        sob.close()
    assert read_records(kafka.bootstrap, topic) == []


def test_executors_send_to_the_sql_queue_on_postgresql(
    spark: Any, tmp_path: Path, pg_url: str
) -> None:
    sob = _sob(spark, tmp_path / "ws", sql_url=pg_url, default_destination="orders")
    try:
        assert sob.send_from == "executors"
        result = sob.apply(_changes(spark, 20, key="one-key"))
        got = sob.runtime.queue.peek("orders", 100)  # type: ignore[attr-defined]
    finally:
        sob.close()
    assert result.dispatch is not None
    assert result.dispatch.messages_sent == 40
    assert len(got) == 40
    # one ordering key across documents: written together, so by document id, then seq
    order = [(f"doc-{json.loads(m.body)['i']}", json.loads(m.body)["k"]) for m in got]
    assert order == sorted(order)


def test_sqlite_stays_on_the_driver(spark: Any, tmp_path: Path) -> None:
    sob = _sob(spark, tmp_path / "ws", default_destination="orders")
    try:
        assert sob.send_from == "driver"
    finally:
        sob.close()


def _deliver_pending(ws: Path, kafka: KafkaBroker, topic: str, *, rescue: bool) -> None:
    """What the operator's processes do after a crash: a rescue pass (its clock past the rescue
    delay) then ``outbox run-dispatcher --until-idle``, both on Kafka."""
    from datetime import timedelta

    from dispatcher.worker import DispatcherWorker
    from outbox.app.rescue import open_rescuer
    from outbox.core.clock import ManualClock, SystemClock

    with Outbox.open(ws, **_on_kafka(kafka, topic)) as ob:
        if rescue:
            later = ManualClock(SystemClock().now() + timedelta(minutes=5))
            rescuer = open_rescuer(ob.settings, clock=later, queue_clock=SystemClock())
            try:
                rescuer.rescue_pass.run()
            finally:
                rescuer.close()
        DispatcherWorker(ob.runtime, batch_size=64, poll_interval=0.01).run(until_idle=True)


def _committed_ids(ws: Path) -> set[str]:
    with Outbox.open(ws, transport="memory") as ob:
        _v, rows = ob.store.read([f"doc-{i}" for i in range(2000)])
    return {m.message_id for r in rows.values() for m in r.outbox}


def test_a_killed_executor_leaves_the_rest_to_the_rescuer(
    spark: Any, tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    """An executor SIGKILLed after its first batch fails the job (local mode retries no task):
    no marks, no retry commands, and most messages unsent. With the rescuer left out first (the
    mutation: the worker alone) they stay undelivered, so the proof can fail; then the rescuer's
    commands deliver them. One killed job for both (the worker without a rescue pass changes
    nothing: no command to take), as ``test_mixed_writers`` does: each job was ~40 s loaded."""
    ws = tmp_path / "ws"
    sob = _sob(spark, ws, **_on_kafka(kafka, topic), buckets=8)
    try:
        sob.executor_hook = CrashSpec("executor_sent@1=kill")
        result = sob.apply(_changes(spark, 2000, per_doc=1))
        queued = sob.runtime.queue.peek(sob.settings.command_queue, 10)  # type: ignore[attr-defined]
    finally:
        sob.close()
    assert result.version is not None, "the commit is durable"
    assert result.dispatch is None, "the executors' job failed"
    assert queued == [], "no retry command: only the rescuer can finish"
    committed = _committed_ids(ws)
    early = {record_of(r).message_id for r in read_records(kafka.bootstrap, topic)}
    assert early, "the killed executor sent its first batch"
    assert early < committed, "and not everything"
    _deliver_pending(ws, kafka, topic, rescue=False)  # the mutation: the inert rescuer
    delivered = {record_of(r).message_id for r in read_records(kafka.bootstrap, topic)}
    assert delivered == early, "nothing else sends them"
    _deliver_pending(ws, kafka, topic, rescue=True)
    delivered = {record_of(r).message_id for r in read_records(kafka.bootstrap, topic)}
    assert delivered == committed


def test_a_driver_that_dies_after_the_commit_leaves_it_to_the_rescuer(
    spark: Any, tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    from outbox.testing.crash_points import InjectedCrash, crash_points

    ws = tmp_path / "ws"
    sob = _sob(spark, ws, **_on_kafka(kafka, topic))
    try:
        crash_points.arm("after_commit")
        with pytest.raises(InjectedCrash):
            sob.apply(_changes(spark, 30))
    finally:
        crash_points.disarm()
        sob.close()
    assert read_records(kafka.bootstrap, topic) == [], "nothing was sent"
    _deliver_pending(ws, kafka, topic, rescue=True)
    delivered = {record_of(r).message_id for r in read_records(kafka.bootstrap, topic)}
    assert delivered == _committed_ids(ws)
    assert len(delivered) == 60

"""Issue 42, item 4: a poison record must not stall its partition for ever.

Against the real broker: ``outbox migrate`` creates each declared destination's ``{topic}.dlt``,
so a consumer with ``max_tries=3`` moves past a poison record among good ones and a restarted
consumer does not stop at it; a consumer whose dead-letter topic is missing refuses to start in
one line naming the topic and the fix; and a dead-letter produce that fails anyway (the topic
deleted after the start) backs off on the injected clock, commits nothing past the record and
logs the consumer's own fix, then dead-letters the record once the topic is back.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.consumer import (
    DLT_REASON,
    DLT_TOPIC,
    DLT_TRIES,
    BatchReport,
    KafkaConsumer,
)
from dispatcher.kafka.mapping import record_of
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.transports.base import TransportMessage
from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError, UnprocessableMessageError
from testkit.kafka import KafkaBroker, read_records

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def migrate(ws: Path, bootstrap: str, *destinations: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(
        {
            "OUTBOX_WORKSPACE": str(ws),
            "OUTBOX_TRANSPORT": "kafka",
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "OUTBOX_DESTINATIONS": ",".join(destinations),
        }
    )
    done = subprocess.run(
        [OUTBOX, "migrate"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def send(kafka: KafkaBroker, topic: str, records: list[tuple[str, str]]) -> None:
    """(message id, key) pairs, in this order."""
    t = KafkaTransport(kafka.bootstrap)
    t.send(
        [
            TransportMessage(message_id=i, destination=topic, body=i.encode(), session_id=k)
            for i, k in records
        ]
    )
    t.close()


def poll(c: KafkaConsumer, until: Callable[[BatchReport], bool], attempts: int = 60) -> BatchReport:
    """Poll until the summed reports satisfy ``until`` (the group join makes the first polls
    empty, so it counts what happened, not polls)."""
    total = BatchReport()
    for _ in range(attempts):
        r = c.run_once(timeout=0.5)
        for f in ("handled", "duplicates", "dead_lettered", "retried", "dead_letter_failed"):
            setattr(total, f, getattr(total, f) + getattr(r, f))
        if until(total):
            return total
    raise AssertionError(f"only {total}")


def test_a_poison_record_on_a_migrated_topic_is_dead_lettered_and_the_partition_moves_on(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    topic = f"p-{uuid.uuid4().hex[:10]}"
    out = migrate(tmp_path / "ws", kafka.bootstrap, topic)
    assert f"created Kafka topic {topic}.dlt" in out
    made = kafka.admin().list_topics(timeout=30).topics
    assert len(made[f"{topic}.dlt"].partitions) == len(made[topic].partitions) == 4
    good = [(f"g{i:02d}", f"k{i % 8}") for i in range(99)]
    records = [*good[:40], ("poison", "k3"), *good[40:]]  # k3's later records wait behind it
    send(kafka, topic, records)
    arrived: list[str] = []
    calls: dict[str, int] = {}

    def handler(m: TransportMessage) -> None:
        calls[m.message_id] = calls.get(m.message_id, 0) + 1
        if m.message_id == "poison":
            raise UnprocessableMessageError("cannot parse")
        arrived.append(m.message_id)

    group = f"g-{uuid.uuid4().hex[:6]}"
    cfg = KafkaConfig(kafka.bootstrap)
    c = KafkaConsumer(cfg, [topic], group, handler, clock=ManualClock(), max_tries=3)
    report = poll(c, lambda t: t.handled + t.dead_lettered >= 100)
    c.close()
    assert (report.handled, report.dead_lettered, report.dead_letter_failed) == (99, 1, 0)
    assert sorted(arrived) == [i for i, _ in good], "every good record arrived"
    k3 = [i for i, k in good if k == "k3"]
    assert [i for i in arrived if i in k3] == k3, "the key kept its order past the poison"
    [dead] = read_records(kafka.bootstrap, f"{topic}.dlt")
    headers = dict(dead.headers())
    assert record_of(dead).message_id == "poison"
    assert (headers[DLT_REASON], headers[DLT_TRIES], headers[DLT_TOPIC]) == (
        b"Unprocessable",
        b"1",
        topic.encode(),
    )
    later = [("later-3", "k3"), ("later-5", "k5")]
    send(kafka, topic, later)
    arrived.clear()
    c2 = KafkaConsumer(cfg, [topic], group, handler, clock=ManualClock(), max_tries=3)
    report2 = poll(c2, lambda t: t.handled + t.dead_lettered >= 2)
    c2.close()
    assert sorted(arrived) == ["later-3", "later-5"], "the restarted consumer starts past it"
    assert report2.dead_lettered == 0
    assert calls["poison"] == 1


def test_a_consumer_without_its_dead_letter_topic_refuses_to_start_in_one_line(
    kafka: KafkaBroker,
) -> None:
    topic = kafka.create_topic(f"n-{uuid.uuid4().hex[:10]}")
    cfg = KafkaConfig(kafka.bootstrap)
    with pytest.raises(ConfigurationError) as refused:
        KafkaConsumer(cfg, [topic], "g", lambda m: None, clock=ManualClock())
    assert str(refused.value) == (
        f"Kafka at {kafka.bootstrap} (PLAINTEXT) has no dead-letter topic '{topic}.dlt': the "
        f"consumer of {topic} cannot start without it (a record failing its handler would "
        "stop its partition) (fix: run outbox migrate with the topic in destinations, which "
        "creates {destination}.dlt for each, or create it: kafka-topics.sh --bootstrap-server "
        f"{kafka.bootstrap} --create --topic {topic}.dlt)"
    )
    with pytest.raises(ConfigurationError) as custom:  # outbox migrate makes only {topic}.dlt
        KafkaConsumer(
            cfg, [topic], "g", lambda m: None, clock=ManualClock(), dead_letter_topic="dl.{topic}"
        )
    assert custom.value.hint == (
        f"create it: kafka-topics.sh --bootstrap-server {kafka.bootstrap} --create "
        f"--topic dl.{topic}"
    )
    kafka.create_topic(f"{topic}.dlt")
    KafkaConsumer(cfg, [topic], "g", lambda m: None, clock=ManualClock()).close()


def _delete(kafka: KafkaBroker, topic: str) -> None:
    """Delete ``topic`` and wait until the broker answers that it has none (a condition, not
    a time: KRaft takes the deletion in a metadata record first)."""
    admin = kafka.admin()
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found: Any = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return
    raise AssertionError(f"{topic} still listed after its deletion")


def test_a_failing_dead_letter_produce_backs_off_keeps_the_record_and_names_the_fix(
    kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(f"b-{uuid.uuid4().hex[:10]}", 1)
    dlt = kafka.create_topic(f"{topic}.dlt", 1)
    tries: list[str] = []
    order: list[str] = []

    def handler(m: TransportMessage) -> None:
        if m.message_id == "poison":
            tries.append(m.message_id)
            raise RuntimeError("never")
        order.append(m.message_id)

    clock = ManualClock()
    group = f"g-{uuid.uuid4().hex[:6]}"
    cfg = KafkaConfig(kafka.bootstrap)
    backoff = ExponentialBackoff(base=2.0, cap=60.0)  # 2 s, then 4 s: no jitter
    c = KafkaConsumer(
        cfg, [topic], group, handler, clock=clock, max_tries=3, dead_letter_backoff=backoff
    )
    _delete(kafka, dlt)  # after the start-up check: a topic deleted while the consumer runs
    send(kafka, topic, [("poison", "k"), ("after", "k")])
    caplog.set_level(logging.ERROR, logger="outbox.kafka.consumer")
    poll(c, lambda t: t.dead_letter_failed >= 1)
    assert len(tries) == 3
    for _ in range(4):  # the clock has not moved: the partition is paused, nothing is tried
        report = c.run_once(timeout=0.2)
        assert (report.dead_letter_failed, report.rewound, report.handled) == (0, 0, 0)
    assert len(tries) == 3, "nothing tried again"
    assert order == [], "nothing overtook the record"
    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.kafka.consumer"]
    assert line.startswith(f"could not dead-letter poison ({topic} partition 0 offset 0) to {dlt}")
    assert "tries again in 2s, failure 1" in line
    assert line.endswith(
        f"(fix: run outbox migrate with the topic in destinations, which creates "
        f"{{destination}}.dlt for each, or create it: kafka-topics.sh --bootstrap-server "
        f"{kafka.bootstrap} --create --topic {dlt})"
    )
    assert "requeue" not in line
    assert "\n" not in line
    caplog.clear()
    clock.advance(2.0)  # the backoff is over: one more try, then a longer wait
    poll(c, lambda t: t.dead_letter_failed >= 1)
    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.kafka.consumer"]
    assert "tries again in 4s, failure 2" in line
    assert len(tries) == 3, "the handler's verdict is kept: it does not run again"
    kafka.create_topic(dlt, 1)  # the fix
    clock.advance(4.0)
    report = poll(c, lambda t: t.dead_lettered >= 1 and t.handled >= 1)
    c.close()
    assert order == ["after"]
    assert len(tries) == 3
    [dead] = read_records(kafka.bootstrap, dlt)
    assert record_of(dead).message_id == "poison"
    assert (dict(dead.headers())[DLT_REASON], dict(dead.headers())[DLT_TRIES]) == (
        b"MaxTriesExceeded",
        b"3",
    )
    send(kafka, topic, [("later", "k")])
    c2 = KafkaConsumer(cfg, [topic], group, handler, clock=ManualClock(), max_tries=3)
    poll(c2, lambda t: t.handled >= 1)
    c2.close()
    assert order == ["after", "later"], "committed past the record"
    assert len(tries) == 3

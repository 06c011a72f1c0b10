"""The Kafka consumer helper against a real broker: per-key order, offsets committed after the
handler, repeats dropped by the inbox, retries in place, and the dead-letter topic."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.consumer import DLT_REASON, DLT_TRIES, BatchReport, KafkaConsumer
from dispatcher.kafka.mapping import record_of
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.inbox import SqlInbox
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import TransportMessage
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.core.errors import UnprocessableMessageError
from testkit.kafka import KafkaBroker, read_records


@pytest.fixture
def topic(topic: str, kafka: KafkaBroker) -> str:
    """The fresh topic with its dead-letter topic, which a consumer needs to start (one
    partition: the dead letters' ids read 1, 2, 3)."""
    kafka.create_topic(f"{topic}.dlt", 1)
    return topic


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[SqlQueue]:
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    upgrade(url)
    q = SqlQueue(url)
    yield q
    q.close()


def send(kafka: KafkaBroker, topic: str, ids: list[str], key: str = "k") -> None:
    t = KafkaTransport(kafka.bootstrap)
    t.send(
        [
            TransportMessage(message_id=i, destination=topic, body=i.encode(), session_id=key)
            for i in ids
        ]
    )
    t.close()


def drain(c: KafkaConsumer, until: int, attempts: int = 120) -> BatchReport:
    """Poll until ``until`` records were settled (handled, repeats, dead-lettered); the group
    join makes the first polls empty, so it counts settlements, not polls."""
    total = BatchReport()
    for _ in range(attempts):
        r = c.run_once(timeout=0.5)
        for f in ("handled", "duplicates", "dead_lettered", "retried", "rewound"):
            setattr(total, f, getattr(total, f) + getattr(r, f))
        if total.handled + total.duplicates + total.dead_lettered >= until:
            return total
    raise AssertionError(f"settled {total} of {until}")


class DiesBeforeCommit:
    """A real group member whose offset commits never reach Kafka (it dies first)."""

    def __init__(self, kafka: KafkaBroker, group: str) -> None:
        import confluent_kafka

        self.inner = confluent_kafka.Consumer(KafkaConfig(kafka.bootstrap).consumer(group))

    def commit(self, **kw: object) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def consumer(kafka: KafkaBroker, topic: str, handler, **kw) -> KafkaConsumer:  # type: ignore[no-untyped-def]
    kw.setdefault("clock", ManualClock())
    return KafkaConsumer(KafkaConfig(kafka.bootstrap), [topic], kw.pop("group", "g"), handler, **kw)


def test_each_key_in_order_and_a_new_member_starts_after_the_committed_offset(
    kafka: KafkaBroker, topic: str
) -> None:
    send(kafka, topic, [f"a{i}" for i in range(20)], key="a")
    send(kafka, topic, [f"b{i}" for i in range(20)], key="b")
    seen: list[str] = []
    c = consumer(kafka, topic, lambda m: seen.append(m.message_id))
    drain(c, 40)
    c.close()
    assert [s for s in seen if s[0] == "a"] == [f"a{i}" for i in range(20)]
    assert [s for s in seen if s[0] == "b"] == [f"b{i}" for i in range(20)]
    send(kafka, topic, ["a20"], key="a")
    later: list[str] = []
    c2 = consumer(kafka, topic, lambda m: later.append(m.message_id))
    drain(c2, 1)
    c2.close()
    assert later == ["a20"], "the committed offsets are where the group goes on"


def test_the_inbox_drops_a_resend_and_a_redelivery_after_a_crash_before_the_commit(
    kafka: KafkaBroker, topic: str, queue: SqlQueue
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    send(kafka, topic, ["m1", "m2"])
    send(kafka, topic, ["m1"])  # the outbox re-sent m1 (same id)
    runs: list[str] = []
    c = consumer(
        kafka,
        topic,
        lambda m: runs.append(m.message_id),
        group=group,
        inbox=SqlInbox(queue.database, group),
        consumer=DiesBeforeCommit(kafka, group),  # its commit never reaches Kafka
    )
    report = drain(c, 3)
    c.close()
    assert runs == ["m1", "m2"]
    assert report.duplicates == 1
    c2 = consumer(
        kafka,
        topic,
        lambda m: runs.append(m.message_id),
        group=group,
        inbox=SqlInbox(queue.database, group),
    )
    report2 = drain(c2, 3)  # the next member gets all three again
    c2.close()
    assert runs == ["m1", "m2"], "the inbox keeps every handler to one run"
    assert report2.duplicates == 3


def test_without_the_inbox_a_redelivery_runs_the_handler_again(
    kafka: KafkaBroker, topic: str
) -> None:
    """The mutation of the test above: the inbox is what drops the repeats."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    send(kafka, topic, ["m1"])
    runs: list[str] = []
    c = consumer(
        kafka,
        topic,
        lambda m: runs.append(m.message_id),
        group=group,
        consumer=DiesBeforeCommit(kafka, group),
    )
    drain(c, 1)
    c.close()
    c2 = consumer(kafka, topic, lambda m: runs.append(m.message_id), group=group)
    drain(c2, 1)
    c2.close()
    assert runs == ["m1", "m1"]


def test_a_failing_handler_is_retried_in_place_then_dead_lettered_and_the_key_moves_on(
    kafka: KafkaBroker, topic: str
) -> None:
    dlt = f"{topic}.dlt"
    send(kafka, topic, ["ok1", "flaky", "poison", "bad", "ok2"])
    tries: dict[str, int] = {}
    order: list[str] = []

    def handler(m: TransportMessage) -> None:
        tries[m.message_id] = tries.get(m.message_id, 0) + 1
        if m.message_id == "flaky" and tries["flaky"] < 3:
            raise RuntimeError("not yet")
        if m.message_id == "poison":
            raise RuntimeError("never")
        if m.message_id == "bad":
            raise UnprocessableMessageError("cannot parse")
        order.append(m.message_id)

    clock = ManualClock()
    start = clock.now()
    c = consumer(kafka, topic, handler, clock=clock, max_tries=3)
    report = drain(c, 5)
    c.close()
    assert order == ["ok1", "flaky", "ok2"]
    assert tries == {"ok1": 1, "flaky": 3, "poison": 3, "bad": 1, "ok2": 1}
    assert (report.handled, report.dead_lettered, report.retried) == (3, 2, 4)
    assert (clock.now() - start).total_seconds() > 0, "the retries waited (on the clock)"
    dead = {record_of(r).message_id: dict(r.headers()) for r in read_records(kafka.bootstrap, dlt)}
    assert set(dead) == {"poison", "bad"}
    assert dead["poison"][DLT_REASON] == b"MaxTriesExceeded"
    assert dead["poison"][DLT_TRIES] == b"3"
    assert dead["bad"][DLT_REASON] == b"Unprocessable"


def test_outbox_dead_letters_lists_shows_and_requeues_a_dead_letter_topic_and_refuses_purge(
    tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    """Through the CLI: the consumer's dead-letter topic answers ``outbox dead-letters``."""
    import json
    import os

    from tests.cli_child import run_in_one_child

    dlt = f"{topic}.dlt"
    send(kafka, topic, ["poison"])
    c = consumer(kafka, topic, lambda m: (_ for _ in ()).throw(RuntimeError("boom")), max_tries=1)
    drain(c, 1)
    c.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(
        {
            "OUTBOX_WORKSPACE": str(tmp_path / "ws"),
            "OUTBOX_TRANSPORT": "kafka",
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap,
        }
    )
    # The six commands in order, in one child process (each with its own stdout, stderr and
    # exit code): a process each cost an interpreter start and the product's imports.
    commands = [
        [dlt, "list", "--json"],
        [dlt, "show", "1", "--json"],
        [dlt, "show", "7"],
        [dlt, "purge", "--all", "--yes"],
        [dlt, "requeue", "1"],
        ["nope.dlt", "list"],
    ]
    runs = [(["dead-letters", "--kafka-topic", *c], env) for c in commands]
    listed, shown, missing, purge, requeued, unknown = run_in_one_child(runs, tmp_path)
    assert listed.returncode == 0, listed.stderr
    [letter] = json.loads(listed.stdout)
    assert (letter["id"], letter["message_id"], letter["queue"]) == (1, "poison", topic)
    assert letter["reason"] == "MaxTriesExceeded"
    assert letter["description"] == "RuntimeError: boom"
    assert json.loads(shown.stdout)["delivery_count"] == 1
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines() == [
        f"error: no dead letter 7 in Kafka topic {dlt!r} (fix: outbox dead-letters "
        f"--kafka-topic {dlt} list shows the ids)"
    ]
    assert purge.returncode != 0
    assert "Kafka cannot delete records from the dead-letter topic" in purge.stderr
    assert "Traceback" not in purge.stderr
    assert requeued.returncode == 0, requeued.stderr
    assert "requeued 1 dead letter(s)" in requeued.stdout
    back = [record_of(r) for r in read_records(kafka.bootstrap, topic)]
    assert [m.message_id for m in back] == ["poison", "poison"]
    assert not any(k.startswith("outbox-dead-letter") for k in back[1].headers)
    assert unknown.returncode != 0
    assert "has no topic 'nope.dlt'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_the_consumer_prunes_its_inbox_of_ids_handled_longer_ago_than_the_retention(
    kafka: KafkaBroker, topic: str, queue: SqlQueue
) -> None:
    """Issue 42: the Kafka consumer's inbox gained a row per handled message for ever. It now
    deletes ids handled longer ago than ``inbox_retention`` itself, at most once an hour."""
    from datetime import timedelta

    group = f"g-{uuid.uuid4().hex[:6]}"
    clock = ManualClock()
    inbox = SqlInbox(queue.database, group)
    send(kafka, topic, ["old1", "old2"])
    c = consumer(kafka, topic, lambda m: None, group=group, inbox=inbox, clock=clock)
    drain(c, 2)
    assert inbox.handled("old1")
    clock.advance(timedelta(days=8).total_seconds())
    send(kafka, topic, ["new"])
    drain(c, 1)
    c.close()
    assert not inbox.handled("old1")  # a week and a day ago: gone
    assert inbox.handled("new")
    assert c.pruner is not None
    assert c.pruner.pruned == 2

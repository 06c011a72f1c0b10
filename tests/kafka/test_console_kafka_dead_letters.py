"""Kafka dead-letter topics in the console (issue 46, item 3), against the real broker: the list
(newest first), one record with its body, the requeue of a ticked record behind the confirmation
and the token (the copy back on the topic it came from, with its key and message id; the record
stays in the dead-letter topic), and the audit record; no purge is offered. The same workspace's
SQL queue holds the console's own tables (SQLite)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.consumer import DLT_ERROR, DLT_REASON, DLT_TOPIC, DLT_TRIES
from dispatcher.kafka.dead_letters import KafkaDeadLetters
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import TransportMessage
from migrations.sql import upgrade
from outbox.app.console import ConsoleConfig, create_app
from outbox.app.history import History
from outbox.app.operators import Audit
from outbox.core.clock import SystemClock
from testkit.kafka import KafkaBroker, read_records
from tests.console.conftest import HOST, TOKEN, csrf_of, unlock


@pytest.fixture
def topics(kafka: KafkaBroker) -> tuple[str, str]:
    return dead_lettered_topics(kafka)


def dead_lettered_topics(kafka: KafkaBroker) -> tuple[str, str]:
    """(orders, orders.dlt): two records dead-lettered from orders, the second with markup."""
    orders = kafka.create_topic(f"orders-{uuid.uuid4().hex[:8]}", partitions=1)
    dlt = kafka.create_topic(f"{orders}.dlt", partitions=1)
    transport = KafkaTransport(kafka.bootstrap)
    try:
        transport.send(
            [
                TransportMessage(
                    message_id=f"m-{i}",
                    destination=dlt,
                    body=b'{"order": "<b>7</b>"}' if i else b'{"order": 1}',
                    session_id=f"cust-{i}",
                    headers={
                        DLT_TOPIC: orders,
                        DLT_REASON: "Poison",
                        DLT_TRIES: "3",
                        DLT_ERROR: f"ValueError: bad order {i}",
                    },
                )
                for i in range(2)
            ]
        )
    finally:
        transport.close()
    return orders, dlt


@pytest.fixture
def client(tmp_path: Path, kafka: KafkaBroker, topics: tuple[str, str]) -> Iterator[Any]:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    upgrade(url)
    config = KafkaConfig(kafka.bootstrap)
    with SqlQueue(url) as queue:
        app = create_app(
            ConsoleConfig(
                queue=queue, history=History(queue.database), clock=SystemClock(), token=TOKEN,
                kafka_topics=(topics[1],),
                kafka_dead_letters=lambda topic: KafkaDeadLetters(config, topic),
            )
        )  # fmt: skip
        c = app.test_client()
        c.environ_base.update({"HTTP_HOST": HOST["Host"]})
        yield c, queue


def test_list_show_and_requeue_a_kafka_dead_letter(
    client: tuple[FlaskClient, SqlQueue], kafka: KafkaBroker, topics: tuple[str, str]
) -> None:
    c, queue = client
    orders, dlt = topics
    page = c.get("/kafka", query_string={"topic": dlt}).get_data(as_text=True)
    assert "2 records." in page
    assert re.findall(r'<td class="mono">([^<]+)</td>', page) == ["m-1", "m-0"]  # newest first
    assert "Purge" not in page
    shown = c.get("/kafka/show", query_string={"topic": dlt, "id": "2"}).get_data(as_text=True)
    assert "&lt;b&gt;7&lt;/b&gt;" in shown
    assert "ValueError: bad order 1" in shown
    assert c.get("/kafka", query_string={"topic": "other"}).status_code == 404

    csrf = csrf_of(c, f"/kafka?topic={dlt}")
    locked = c.post("/kafka/apply", data={"csrf": csrf, "topic": dlt, "id": "1"})
    assert locked.status_code == 403
    csrf = unlock(c)
    confirm = c.post("/kafka/confirm", data={"csrf": csrf, "topic": dlt, "id": "1"})
    assert "Requeue 1 dead letter of" in confirm.get_data(as_text=True)
    done = c.post("/kafka/apply", data={"csrf": csrf, "topic": dlt, "id": "1"},
                  follow_redirects=True)  # fmt: skip
    assert "1 dead letter of" in done.get_data(as_text=True)
    back = read_records(kafka.bootstrap, orders)
    assert [(r.key(), r.value()) for r in back] == [(b"cust-0", b'{"order": 1}')]
    assert len(read_records(kafka.bootstrap, dlt)) == 2  # still there: Kafka deletes nothing
    [entry] = Audit(queue.database, SystemClock()).page(limit=1)
    assert (entry.action, entry.target, entry.outcome) == (
        "kafka-dead-letters.requeue",
        f"{dlt}: 1 dead letters: 1",
        "1 requeued",
    )


def test_pages_read_only_their_records_and_together_are_the_whole_topic(
    kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two partitions of 7 and 5 records, pages of 3: newest first (the highest ids), every
    record once across the pages, the last page says no more; each page reads at most 3
    offsets of each partition it needs (not the topic); a record is shown, and a selection
    requeued, by reading only its offsets."""
    from dispatcher.kafka import dead_letters as module

    dlt = kafka.create_topic(f"paged-{uuid.uuid4().hex[:8]}.dlt", partitions=2)
    import confluent_kafka

    from dispatcher.kafka.mapping import headers_of

    producer = confluent_kafka.Producer(KafkaConfig(kafka.bootstrap).producer())
    for partition, count in ((0, 7), (1, 5)):
        for i in range(count):
            m = TransportMessage(message_id=f"p{partition}-{i}", destination=dlt, body=b"{}",
                                 headers={DLT_TOPIC: "orders", DLT_REASON: "Poison"})  # fmt: skip
            producer.produce(dlt, m.body, partition=partition, headers=headers_of(m))
    assert producer.flush(30) == 0
    letters = KafkaDeadLetters(KafkaConfig(kafka.bootstrap), dlt)
    every = KafkaDeadLetters(letters.config, dlt).list_dead_letters(limit=99)  # the whole topic
    whole = sorted((d.id for d in every), reverse=True)
    assert len(whole) == 12
    read: list[dict[int, tuple[int, int]]] = []
    real = module.read_ranges

    def spy(config: Any, topic: str, ranges: dict[int, tuple[int, int]]) -> list[Any]:
        read.append(dict(ranges))
        return real(config, topic, ranges)

    monkeypatch.setattr(module, "read_ranges", spy)
    paged: list[int] = []
    before = None
    while True:
        shown, total, more = letters.page(before, 3)
        assert total == 12
        paged += [d.id for d in shown]
        if not more:
            break
        before = shown[-1].id
    assert paged == whole
    assert all(end - start <= 3 for ranges in read for start, end in ranges.values())
    read.clear()
    assert letters.get_dead_letter(whole[5]).id == whole[5]
    assert [d.id for d in letters.by_ids([whole[0], whole[-1]])] == sorted([whole[0], whole[-1]])
    assert whole[5] == 7  # partition 0's newest (offset 6), after partition 1's five
    assert read == [{0: (6, 7)}, {0: (0, 1), 1: (4, 5)}]

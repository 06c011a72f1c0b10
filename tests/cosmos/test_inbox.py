"""The shipped inbox contract, with its consumer tests, on ``CosmosInbox`` over the local
Cosmos-protocol server (409 on a repeated create, 412 on a stale etag), and the consumer's order
with an inbox outside its SQL database: claim, handler, record, complete; a crash at any step
loses nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.inbox import Inbox, TransactionalInbox
from dispatcher.queue.inbox_cosmos import CosmosInbox
from dispatcher.queue.messages import ReceivedMessage
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError, QueueUnavailableError
from outbox.testing.contracts.inbox import InboxConsumerContract


class TestCosmosInbox(InboxConsumerContract):
    @pytest.fixture(autouse=True)
    def _container(self, cosmos_inbox_container: Any) -> None:
        self.container = cosmos_inbox_container

    def make_inbox(self, consumer: str) -> Inbox:
        inbox = CosmosInbox(self.container, consumer)
        assert not isinstance(inbox, TransactionalInbox)
        return inbox


@pytest.fixture
def queue(tmp_path: Path, clock: ManualClock) -> Iterator[SqlQueue]:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    q = SqlQueue(url, clock=clock, lock_duration=30, max_delivery_count=5)
    yield q
    q.close()


def send(queue: SqlQueue, mid: str) -> None:
    queue.send("q", QueueMessage(mid.encode(), message_id=mid))


def test_a_repeat_is_dropped(
    queue: SqlQueue, clock: ManualClock, cosmos_inbox_container: Any
) -> None:
    calls: list[str] = []
    inbox = CosmosInbox(cosmos_inbox_container, "billing")
    consumer = Consumer(queue, "q", lambda m: calls.append(m.message_id), inbox=inbox)
    assert consumer.inbox_name == "billing"
    send(queue, "x")
    consumer.run_once()
    clock.advance(601)  # past duplicate detection: the queue takes the repeat
    send(queue, "x")
    assert consumer.run_once() == 1
    assert calls == ["x"]
    assert queue.stats() == {}


def test_a_failed_record_redelivers_and_the_handler_runs_again(
    queue: SqlQueue, clock: ManualClock, cosmos_inbox_container: Any
) -> None:
    """Crash point 1, between the handler and the record: at-least-once, the message survives."""
    calls: list[str] = []
    inbox = CosmosInbox(cosmos_inbox_container, "billing")
    real_record = inbox.record
    down = [True]

    def record(message_id: str, **kw: Any) -> bool:
        if down[0]:
            down[0] = False
            raise QueueUnavailableError("Cosmos DB is unreachable")
        return real_record(message_id, **kw)

    inbox.record = record  # type: ignore[method-assign]
    consumer = Consumer(
        queue, "q", lambda m: calls.append(m.message_id), inbox=inbox, backoff=lambda _n: 0
    )
    send(queue, "x")
    consumer.run_once()  # handler ran, record failed: abandoned, not completed
    assert queue.peek("q")[0].delivery_count == 1
    assert not inbox.handled("x")
    consumer.run_once()
    assert calls == ["x", "x"]
    assert inbox.handled("x")
    assert queue.stats() == {}


def test_a_lost_completion_after_the_record_is_dropped_on_redelivery(
    queue: SqlQueue, clock: ManualClock, cosmos_inbox_container: Any
) -> None:
    """Crash point 2, between the record and the completion: the redelivery is deduplicated."""
    calls: list[str] = []
    inbox = CosmosInbox(cosmos_inbox_container, "billing")
    consumer = Consumer(queue, "q", lambda m: calls.append(m.message_id), inbox=inbox)
    real_complete = queue.complete
    queue.complete = lambda _m: None  # type: ignore[assignment,method-assign,return-value]
    send(queue, "x")
    consumer.run_once()  # handled and recorded; the completion never happened (a crash)
    queue.complete = real_complete  # type: ignore[method-assign]
    assert queue.peek("q")[0].message_id == "x"
    clock.advance(31)  # the lock expires: redelivered
    assert consumer.run_once() == 1
    assert calls == ["x"]
    assert queue.stats() == {}


def test_a_connection_handler_needs_the_sql_inbox(
    queue: SqlQueue, cosmos_inbox_container: Any
) -> None:
    def handler(_m: ReceivedMessage, _conn: Connection) -> None:
        pass

    with pytest.raises(ConfigurationError, match="cannot join"):
        Consumer(queue, "q", handler, inbox=CosmosInbox(cosmos_inbox_container, "c"))


def test_an_item_written_before_claims_stays_handled(cosmos_inbox_container: Any) -> None:
    """Items of the earlier inbox (a conditional create with ``handled_at`` only) keep meaning
    "handled": a claim of the id is ``HANDLED`` and a record is second."""
    from datetime import UTC, datetime, timedelta

    from dispatcher.queue.inbox_cosmos import item_id

    key = item_id("billing", "old")
    cosmos_inbox_container.create_item(
        {
            "id": key,
            "pk": key,
            "consumer": "billing",
            "message_id": "old",
            "handled_at": "2026-01-01T00:00:00+00:00",
        }
    )
    inbox = CosmosInbox(cosmos_inbox_container, "billing")
    at = datetime(2026, 6, 1, tzinfo=UTC)
    assert inbox.handled("old")
    assert inbox.claim("old", "a", lease=timedelta(seconds=30), at=at).handled
    assert inbox.record("old", at=at) is False
    assert inbox.renew("old", "a", lease=timedelta(seconds=30), at=at) is False

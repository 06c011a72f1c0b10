"""The consumer with the SQL inbox, on SQLite and PostgreSQL, where it differs from other inboxes
(the contract's consumer tests run on every inbox: tests/queue/test_inbox.py): a handler that
takes a Connection claims, works, records and completes in one transaction; a consumer of the
same name without one is respected; revision 0004 keeps old inbox rows handled."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, insert, select, text

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.inbox import ClaimOutcome, SqlInbox
from dispatcher.queue.messages import ReceivedMessage
from migrations.sql import _config, upgrade
from migrations.sql.tables import inbox as inbox_table
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError
from outbox.core.sql import make_engine

WAIT = 20.0


def send_twice(queue: SqlQueue, clock: ManualClock, mid: str = "x") -> None:
    queue.send("q", QueueMessage(b"1", message_id=mid))
    clock.advance(601)  # past duplicate detection: the queue takes the repeat
    queue.send("q", QueueMessage(b"2", message_id=mid))


def _make_ledger(queue: SqlQueue) -> None:
    with queue.engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger (message_id VARCHAR(64), body VARCHAR(8))"))


def _ledger(queue: SqlQueue) -> list[str]:
    with queue.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT message_id FROM ledger"))]


def test_concurrent_deliveries_to_connection_handlers_take_effect_once(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """Two consumers, one delivery each, released together: the second transaction waits for
    the first (PostgreSQL: the inbox row; SQLite: the single writer) and finds the id handled.
    The ledger has no unique key, so only the inbox keeps it to one row."""
    _make_ledger(queue)
    send_twice(queue, clock)
    both_received = threading.Barrier(2)
    real_receive = queue.receive

    def receive(*a: Any, **kw: Any) -> list[ReceivedMessage]:
        got = real_receive(*a, **kw)
        both_received.wait(WAIT)
        return got

    def handler(m: ReceivedMessage, conn: Connection) -> None:
        conn.execute(text("INSERT INTO ledger VALUES (:m, 'x')"), {"m": m.message_id})

    queue.receive = receive  # type: ignore[method-assign]
    consumers = [Consumer(queue, "q", handler, inbox="billing") for _ in range(2)]
    threads = [threading.Thread(target=c.run_once, args=(1,)) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    assert not any(t.is_alive() for t in threads)
    assert _ledger(queue) == ["x"]
    assert queue.stats() == {}  # the repeat was completed in its own transaction
    assert SqlInbox(queue.database, "billing").handled("x")


def test_a_connection_handler_waits_for_a_claim_of_a_consumer_without_one(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """Consumers of one name in both modes (a deployment changing the handler): a live claim of
    the other mode is respected; its transaction rolls back and the delivery waits."""
    _make_ledger(queue)
    inbox = SqlInbox(queue.database, "billing")
    assert inbox.claim("x", "plain-consumer", lease=timedelta(seconds=60), at=clock.now()).won
    queue.send("q", QueueMessage(b"1", message_id="x"))

    def handler(m: ReceivedMessage, conn: Connection) -> None:
        conn.execute(text("INSERT INTO ledger VALUES (:m, 'x')"), {"m": m.message_id})

    consumer = Consumer(queue, "q", handler, inbox="billing")
    assert consumer.run_once() == 1
    assert _ledger(queue) == []
    [waiting] = queue.peek("q")
    assert (waiting.state, waiting.delivery_count) == ("scheduled", 1)
    clock.advance(30)  # at most one lease (the lock duration, 30 s) later: still held
    assert consumer.run_once() == 1
    assert _ledger(queue) == []
    clock.advance(30)  # the plain consumer's 60 s lease has ended: taken over
    assert consumer.run_once() == 1
    assert _ledger(queue) == ["x"]
    assert queue.stats() == {}
    assert inbox.claim("x", "later", lease=timedelta(seconds=1), at=clock.now()).handled


def test_the_sql_inbox_completes_in_the_records_transaction(queue: SqlQueue) -> None:
    """Without a Connection handler: claim, handler, then ONE transaction for the record and
    the completion (the queue's ``complete`` is not called)."""
    queue.send("q", QueueMessage(b"1", message_id="x"))
    queue.complete = None  # type: ignore[assignment,method-assign]  # any call would fail
    calls: list[str] = []
    consumer = Consumer(queue, "q", lambda m: calls.append(m.message_id), inbox=True)
    assert consumer.run_once() == 1
    assert calls == ["x"]
    assert queue.stats() == {}
    assert SqlInbox(queue.database, "q").handled("x")


def test_a_lost_lock_still_records(queue: SqlQueue, clock: ManualClock) -> None:
    """The handler outlived its lock (no renewal): the record still commits, so the redelivery
    is dropped instead of running the handler again."""
    queue.send("q", QueueMessage(b"1", message_id="x"))
    calls: list[str] = []

    def handler(m: ReceivedMessage) -> None:
        calls.append(m.message_id)
        clock.advance(31)  # the lock (30 s) expires; the renewer checks only every 60 s

    consumer = Consumer(queue, "q", handler, inbox=True, renew_check_interval=60)
    assert consumer.run_once() == 1
    assert len(queue.peek("q")) == 1
    assert consumer.run_once() == 1  # redelivered: dropped by the inbox
    assert calls == ["x"]
    assert queue.stats() == {}


def test_the_lease_defaults_to_the_lock_duration(queue: SqlQueue) -> None:
    assert Consumer(queue, "q", print, inbox=True).inbox_lease == timedelta(seconds=30)
    assert Consumer(queue, "q", print, inbox=True, inbox_lease=90).inbox_lease == timedelta(
        seconds=90
    )
    with pytest.raises(ConfigurationError, match="inbox_lease"):
        Consumer(queue, "q", print, inbox=True, inbox_lease=0)


def test_an_object_that_is_not_an_inbox_is_refused(queue: SqlQueue) -> None:
    class OldInbox:  # handled and record only: cannot claim
        consumer = "c"

        def handled(self, message_id: str) -> bool:
            return False

        def record(self, message_id: str, *, at: datetime) -> bool:
            return True

    with pytest.raises(ConfigurationError, match="not an inbox"):
        Consumer(queue, "q", print, inbox=OldInbox())  # type: ignore[arg-type]


def test_an_sql_inbox_of_another_database_does_not_join(
    queue: SqlQueue, tmp_path: Any, clock: ManualClock
) -> None:
    """It records in its own database (then the queue completes); a Connection handler, whose
    transaction is the queue's, cannot use it."""
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(other_url)
    other = SqlQueue(other_url, clock=clock)
    try:
        inbox = SqlInbox(other.database, "billing")
        assert not inbox.joins(queue.database)
        calls: list[str] = []
        queue.send("q", QueueMessage(b"1", message_id="x"))
        Consumer(queue, "q", lambda m: calls.append(m.message_id), inbox=inbox).run_once()
        assert calls == ["x"]
        assert inbox.handled("x")
        assert not SqlInbox(queue.database, "billing").handled("x")
        assert queue.stats() == {}

        def handler(_m: ReceivedMessage, _conn: Connection) -> None:
            pass

        with pytest.raises(ConfigurationError, match="cannot join"):
            Consumer(queue, "q", handler, inbox=inbox)
    finally:
        other.close()


# --- revision 0004 on a database with inbox rows --------------------------------------------


def test_revision_0004_keeps_old_inbox_rows_handled(sql_url: str) -> None:
    """Rows written at 0003 (handled ids, nothing else) are handled after the upgrade: a claim
    of one is ``HANDLED``, and new ids are claimed. A downgrade drops the claims only."""
    from alembic import command

    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    engine = make_engine(sql_url)
    try:
        cfg = _config()
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003_defer_and_schedule")
            conn.commit()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO outbox_inbox (consumer, message_id, handled_at) "
                    "VALUES ('billing', 'old', :t)"
                ),
                {"t": t0},
            )
        assert upgrade(engine)[0] == (
            "sql schema: applied 0004_inbox_claims (Inbox claims: a consumer claims a message "
            "id before its handler runs.)"
        )
        queue = SqlQueue(sql_url)
        try:
            inbox = SqlInbox(queue.database, "billing")
            assert inbox.handled("old")
            lease = timedelta(seconds=30)
            assert inbox.claim("old", "a", lease=lease, at=t0).outcome is ClaimOutcome.HANDLED
            assert inbox.record("old", at=t0) is False
            assert inbox.claim("new", "a", lease=lease, at=t0).won
        finally:
            queue.close()
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0003_defer_and_schedule")
            conn.commit()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT message_id FROM outbox_inbox")).scalars().all()
        assert rows == ["old"]
        with (
            pytest.raises(Exception, match=r"(?i)not.null|null value"),  # NOT NULL again
            engine.begin() as conn,
        ):
            conn.execute(text("INSERT INTO outbox_inbox (consumer, message_id) VALUES ('b', 'n')"))
        assert upgrade(engine)  # and up again, for the fixture's later users
        with engine.connect() as conn:
            got = conn.execute(select(inbox_table.c.message_id, inbox_table.c.owner)).all()
        assert [tuple(r) for r in got] == [("old", None)]
        with engine.begin() as conn:  # the table as the tables module describes it
            conn.execute(insert(inbox_table).values(consumer="b", message_id="m", owner="o"))
    finally:
        engine.dispose()

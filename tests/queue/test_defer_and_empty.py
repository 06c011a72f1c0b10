"""Issue 16 on the SQL queue beyond the shipped contract: empty bodies through the transports, the
consumer and the CLI; defer by the consumer's outcome; and revision 0003 upgrading a database that
already holds messages (SQLite and a real PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Connection, MetaData, Table, insert, select, text

from dispatcher.queue import Consumer, DeferMessage, QueueMessage, SqlQueue
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.sql import SqlQueueTransport
from migrations.sql import upgrade
from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.core.sql import make_engine

# --- empty bodies ------------------------------------------------------------------------------


def test_the_sql_transport_and_the_consumer_carry_an_empty_body(queue: SqlQueue) -> None:
    SqlQueueTransport(queue).send(
        [TransportMessage("e1", "q", b"", subject="Ping", headers={"kind": "signal"})]
    )
    seen: list[tuple[bytes, str, dict[str, Any]]] = []
    Consumer(queue, "q", lambda m: seen.append((m.body, m.subject, m.headers))).run_once()
    assert seen == [(b"", "Ping", {"kind": "signal"})]


def test_the_servicebus_transport_sends_an_empty_body() -> None:
    pytest.importorskip("azure.servicebus")
    from dispatcher.servicebus.transport import ServiceBusTransport
    from outbox.testing.servicebus_fake import FakeServiceBus

    bus = FakeServiceBus(ManualClock())
    bus.create_queue("q")
    transport = ServiceBusTransport(bus.client())
    transport.send([TransportMessage("e1", "q", b"", subject="Ping", session_id="S")])
    [stored] = bus.messages("q")
    assert (stored.message_id, stored.body) == ("e1", b"")


def test_a_received_sdk_message_without_a_body_is_empty() -> None:
    """``ServiceBusMessage(None)`` arrives with ``body`` None (an AMQP value body)."""
    from dispatcher.servicebus.commands import body

    class NoBody:
        body = None

    assert body(NoBody()) == b""


def test_the_cli_shows_an_empty_body_and_deferred_messages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    upgrade(url)
    queue = SqlQueue(url)
    queue.send("q", [QueueMessage(b"", message_id="e1"), QueueMessage(b"x", message_id="d1")])
    _, d1 = queue.receive("q", 2)
    queue.defer(d1)
    queue.close()

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, ["-w", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
        return result.output

    assert json.loads(run("queue", "stats", "--json")) == [
        {
            "queue": "q",
            "active": 0,
            "scheduled": 0,
            "locked": 1,
            "deferred": 1,
            "dead_lettered": 0,
        }
    ]
    assert "(empty)" in run("queue", "peek", "q")
    [only] = json.loads(run("queue", "peek", "q", "--deferred", "--json"))
    assert (only["message_id"], only["state"], only["delivery_count"]) == ("d1", "deferred", 1)
    assert "deferred" in run("queue", "stats")


# --- defer by outcome --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["raise", "return", "return-in-transaction"])
def test_the_consumer_defers_by_outcome(queue: SqlQueue, how: str) -> None:
    queue.send("q", [QueueMessage(b"a", message_id="a"), QueueMessage(b"b", message_id="b")])

    def plain(m: ReceivedMessage) -> DeferMessage | None:
        if m.message_id != "a":
            return None
        if how == "raise":
            raise DeferMessage("waiting for its order")
        return DeferMessage("waiting for its order")

    def in_tx(m: ReceivedMessage, conn: Connection) -> DeferMessage | None:
        conn.execute(text("CREATE TABLE IF NOT EXISTS seen (id TEXT)"))
        conn.execute(text("INSERT INTO seen VALUES (:i)"), {"i": m.message_id})
        return DeferMessage() if m.message_id == "a" else None

    handler: Any = in_tx if how == "return-in-transaction" else plain
    consumer = Consumer(queue, "q", handler, concurrency=2)
    assert consumer.run_once() == 2
    assert consumer.processed == 1
    [deferred] = queue.peek("q", deferred=True)
    assert (deferred.message_id, deferred.delivery_count) == ("a", 1)
    assert consumer.run_once() == 0  # out of the line
    if how == "return-in-transaction":  # the deferring handler's work rolled back
        with queue.engine.connect() as conn:
            assert conn.execute(text("SELECT id FROM seen")).scalars().all() == ["b"]
    [a] = queue.receive_deferred("q", deferred.sequence_number)
    queue.complete(a)
    assert queue.stats() == {}


# --- revision 0003 on a database with messages -------------------------------------------------


def test_revision_0003_upgrades_a_database_with_messages(sql_url: str) -> None:
    """Rows written at 0002 keep their sequence numbers and state; a row scheduled by its sender
    becomes ``scheduled`` (not in its session until its time), an abandoned one's delay still
    holds its session, and the new settlements work on old rows."""
    from alembic import command

    from migrations.sql import _config
    from migrations.sql.tables import queue_messages as M

    engine = make_engine(sql_url)
    try:
        cfg = _config()
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0002_claim_log")
            conn.commit()
        t0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
        old = Table(  # the table as 0002 left it: no deferred, no scheduled
            M.name,
            MetaData(),
            *(c._copy() for c in M.c if c.name not in ("deferred", "scheduled")),
        )
        rows = [
            # session S: s1 scheduled by its sender for later, s2 due now
            ("s1", "S", t0 + timedelta(minutes=5), 0),
            ("s2", "S", t0, 0),
            # session R: r1 abandoned with a delay (delivered once), r2 due
            ("r1", "R", t0 + timedelta(minutes=5), 1),
            ("r2", "R", t0, 0),
            ("n1", None, t0, 0),
        ]
        with engine.begin() as conn:
            conn.execute(
                insert(old),
                [
                    {
                        "queue": "q",
                        "message_id": mid,
                        "session_id": session,
                        "body": b"",
                        "subject": "",
                        "content_type": "",
                        "headers": "{}",
                        "enqueued_at": t0,
                        "not_before": not_before,
                        "delivery_count": count,
                    }
                    for mid, session, not_before, count in rows
                ],
            )
        with engine.connect() as conn:
            before = conn.execute(
                text("SELECT message_id, sequence_number FROM outbox_queue_messages")
            ).all()
        assert upgrade(engine)[0] == (  # then the later revisions
            "sql schema: applied 0003_defer_and_schedule (Deferred messages and scheduled "
            "messages outside their session.)"
        )
        with engine.connect() as conn:
            after = conn.execute(
                select(M.c.message_id, M.c.sequence_number, M.c.deferred, M.c.scheduled)
            ).all()
        assert {(m, s) for m, s, _, _ in after} == {tuple(r) for r in before}
        assert {m: (d, s) for m, _, d, s in after} == {
            "s1": (False, True),
            "s2": (False, False),
            "r1": (False, False),
            "r2": (False, False),
            "n1": (False, False),
        }
    finally:
        engine.dispose()
    clock = ManualClock(t0)
    queue = SqlQueue(sql_url, clock=clock)
    try:
        got = {m.message_id: m for m in queue.receive("q", 10)}
        assert sorted(got) == ["n1", "s2"]  # s2 goes ahead of scheduled s1; r2 waits for r1
        queue.defer(got["n1"])
        assert queue.stats("q")["q"].deferred == 1
        queue.complete(got["s2"])
        clock.advance(300)
        assert sorted(m.message_id for m in queue.receive("q", 10)) == ["r1", "s1"]
    finally:
        queue.close()

"""The consumer helper: settle by outcome, backoff, lock renewal, session order, inbox, stop."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Connection, text

from dispatcher.queue import (
    Consumer,
    ExponentialBackoff,
    QueueMessage,
    SqlQueue,
    UnprocessableMessageError,
)
from dispatcher.queue.messages import ReceivedMessage
from outbox.core.clock import ManualClock

#: Seconds a test waits for another thread before calling it hung. Only a hang reaches it:
#: every wait returns as soon as its event comes, so a loaded machine costs nothing.
HANG = 60.0


def send(queue: SqlQueue, *mids: str, session: str | None = None) -> None:
    queue.send(
        "q", [QueueMessage(mid.encode(), message_id=mid, session_id=session) for mid in mids]
    )


def test_success_completes(queue: SqlQueue) -> None:
    send(queue, "a", "b")
    seen: list[str] = []
    consumer = Consumer(queue, "q", lambda m: seen.append(m.message_id), concurrency=2)
    assert consumer.run_once() == 2
    assert sorted(seen) == ["a", "b"]
    assert queue.stats() == {}


def test_exception_abandons_with_exponential_backoff(queue: SqlQueue, clock: ManualClock) -> None:
    send(queue, "a")

    def fail(_m: ReceivedMessage) -> None:
        raise RuntimeError("downstream is down")

    consumer = Consumer(queue, "q", fail, backoff=ExponentialBackoff(base=2, cap=100))
    assert consumer.run_once() == 1
    assert queue.peek("q")[0].state == "scheduled"
    clock.advance(1.9)
    assert consumer.run_once() == 0
    clock.advance(0.1)  # first retry after 2s
    assert consumer.run_once() == 1
    clock.advance(3.9)
    assert consumer.run_once() == 0
    clock.advance(0.1)  # then 4s; max_delivery_count=3 ends it in dead letters
    assert consumer.run_once() == 1
    [dl] = queue.list_dead_letters()
    assert dl.reason == "MaxDeliveryCountExceeded"


def test_permanent_error_dead_letters(queue: SqlQueue) -> None:
    send(queue, "a", "b")

    class Poison(Exception):
        pass

    def handler(m: ReceivedMessage) -> None:
        if m.message_id == "a":
            raise UnprocessableMessageError("schema v0 is not supported")
        raise Poison("bad")

    Consumer(
        queue, "q", handler, permanent_errors=(UnprocessableMessageError, Poison), concurrency=2
    ).run_once()
    reasons = {d.message_id: (d.reason, d.description) for d in queue.list_dead_letters()}
    assert reasons == {
        "a": ("UnprocessableMessageError", "schema v0 is not supported"),
        "b": ("Poison", "bad"),
    }


def test_long_handler_keeps_its_lock(queue: SqlQueue, clock: ManualClock) -> None:
    send(queue, "a")
    renewed = threading.Event()
    original = queue.renew_lock

    def spy(m: Any) -> Any:
        out = original(m)
        renewed.set()
        return out

    queue.renew_lock = spy  # type: ignore[method-assign,assignment]
    stolen: list[object] = []

    def slow(_m: ReceivedMessage) -> None:
        for _ in range(3):  # 60s of handler time on a 30s lock
            renewed.clear()
            clock.advance(20)
            assert renewed.wait(HANG), "the lock was not renewed"
            stolen.extend(queue.receive("q"))

    Consumer(queue, "q", slow, renew_check_interval=0.01).run_once()
    assert stolen == []
    assert queue.stats() == {}  # completed with a still-valid lock


def test_run_once_handles_a_batch_and_keeps_the_waiting_messages_locks(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """One thread, three messages: one receive takes all three; while the first runs 60 s on a
    30 s lock, the two waiting for the thread keep theirs (nobody else can take them)."""
    send(queue, "a", "b", "c")
    renewed = {mid: threading.Event() for mid in ("b", "c")}
    original = queue.renew_lock

    def spy(m: Any) -> Any:
        out = original(m)
        if m.message_id in renewed:
            renewed[m.message_id].set()
        return out

    queue.renew_lock = spy  # type: ignore[method-assign,assignment]
    seen: list[str] = []
    stolen: list[object] = []

    def handler(m: ReceivedMessage) -> None:
        seen.append(m.message_id)
        if m.message_id == "a":
            for _ in range(3):
                for event in renewed.values():
                    event.clear()
                clock.advance(20)
                assert all(e.wait(HANG) for e in renewed.values()), "a waiting lock was not renewed"
                stolen.extend(queue.receive("q"))

    consumer = Consumer(queue, "q", handler, renew_check_interval=0.01)
    assert consumer.max_messages == 16
    assert consumer.run_once() == 3
    assert seen == ["a", "b", "c"]
    assert stolen == []
    assert queue.stats() == {}  # all three completed with valid locks
    send(queue, "d", "e")
    assert consumer.run_once(max_messages=1) == 1
    assert Consumer(queue, "q", handler, max_messages=5).run_once() == 1
    assert seen[3:] == ["d", "e"]


def test_session_order_is_kept_with_concurrency(queue: SqlQueue) -> None:
    send(queue, "a1", "a2", "a3", session="A")
    send(queue, "b1", "b2", session="B")
    seen: list[str] = []
    consumer = Consumer(queue, "q", lambda m: seen.append(m.message_id), concurrency=4)
    while consumer.run_once():
        pass
    assert [s for s in seen if s[0] == "a"] == ["a1", "a2", "a3"]
    assert [s for s in seen if s[0] == "b"] == ["b1", "b2"]


def test_inbox_drops_a_repeat(queue: SqlQueue, clock: ManualClock) -> None:
    calls: list[str] = []
    consumer = Consumer(queue, "q", lambda m: calls.append(m.message_id), inbox="billing")
    send(queue, "x")
    consumer.run_once()
    clock.advance(601)  # past duplicate detection: the queue takes the repeat
    send(queue, "x")
    assert consumer.run_once() == 1
    assert calls == ["x"]
    assert queue.stats() == {}


def _make_ledger(queue: SqlQueue) -> None:
    with queue.engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger (message_id VARCHAR(64) PRIMARY KEY)"))


def _ledger(queue: SqlQueue) -> list[str]:
    with queue.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT message_id FROM ledger ORDER BY 1"))]


def test_inbox_in_the_handlers_transaction(queue: SqlQueue, clock: ManualClock) -> None:
    _make_ledger(queue)
    fail = [True]

    def handler(m: ReceivedMessage, conn: Connection) -> None:
        conn.execute(text("INSERT INTO ledger VALUES (:m)"), {"m": m.message_id})
        if fail[0]:
            fail[0] = False
            raise RuntimeError("crash after the SQL work")

    consumer = Consumer(queue, "q", handler, inbox=True, backoff=lambda _n: 0)
    send(queue, "x")
    consumer.run_once()  # fails: ledger row, inbox row and completion all roll back
    assert _ledger(queue) == []
    assert queue.peek("q")[0].delivery_count == 1
    consumer.run_once()
    assert _ledger(queue) == ["x"]
    assert queue.stats() == {}
    clock.advance(601)
    send(queue, "x")  # a repeat: dropped by the inbox, handler not run (no PK violation)
    consumer.run_once()
    assert _ledger(queue) == ["x"]
    assert queue.stats() == {}


def test_stop_abandons_messages_not_started(queue: SqlQueue) -> None:
    send(queue, "a", "b")
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        consumer.stop()

    consumer = Consumer(queue, "q", handler, concurrency=1)
    consumer.run_once()
    assert consumer.processed == 1
    assert consumer.run_once() == 0  # stopped: receives nothing more
    [left] = queue.peek("q")
    assert left.state == "active"


def test_stop_releases_received_but_unstarted(queue: SqlQueue) -> None:
    send(queue, "a", "b", "c")
    started = threading.Event()
    release = threading.Event()

    def handler(_m: ReceivedMessage) -> None:
        started.set()
        release.wait(HANG)

    consumer = Consumer(queue, "q", handler, concurrency=3)
    consumer._pool._max_workers = 1  # type: ignore[attr-defined]  # one runs, two wait
    t = threading.Thread(target=consumer.run_once)
    t.start()
    assert started.wait(HANG)
    consumer.stop()
    release.set()
    t.join(HANG)
    assert consumer.processed == 1
    assert [p.state for p in queue.peek("q")] == ["active", "active"]  # locks released at once


def test_run_forever_stops(queue: SqlQueue) -> None:
    send(queue, "a")
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        consumer.stop()

    consumer = Consumer(queue, "q", handler, poll_interval=0.01)
    consumer.run_forever()
    assert consumer.processed == 1


@pytest.mark.parametrize("concurrency", [0, -1])
def test_bad_concurrency(queue: SqlQueue, concurrency: int) -> None:
    from outbox.core.errors import ValidationError

    with pytest.raises(ValidationError):
        Consumer(queue, "q", print, concurrency=concurrency)


# --- queue calls from a handler that takes a Connection (review item 3) ----------------------


def _run_in_thread(consumer: Consumer) -> None:
    t = threading.Thread(target=consumer.run_once, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the handler deadlocked on the queue's write lock"


def test_a_nested_queue_write_from_a_connection_handler_is_refused(queue: SqlQueue) -> None:
    from outbox.core.errors import QueueError

    errors: list[Exception] = []

    def handler(m: ReceivedMessage, conn: Connection) -> None:
        try:
            queue.send("out", QueueMessage(b"reply", message_id=f"r-{m.message_id}"))
        except QueueError as e:
            errors.append(e)
            raise

    send(queue, "a")
    _run_in_thread(Consumer(queue, "q", handler, backoff=lambda _n: 0))
    [error] = errors
    assert "conn=conn" in str(error)
    assert queue.peek("out") == []
    assert [p.delivery_count for p in queue.peek("q")] == [1]  # abandoned, to retry


def test_send_with_the_handlers_connection_joins_its_transaction(queue: SqlQueue) -> None:
    fail = [True]

    def handler(m: ReceivedMessage, conn: Connection) -> None:
        queue.send("out", QueueMessage(b"reply", message_id=f"r-{m.message_id}"), conn=conn)
        if fail[0]:
            fail[0] = False
            raise RuntimeError("after the send")

    send(queue, "a")
    consumer = Consumer(queue, "q", handler, backoff=lambda _n: 0)
    _run_in_thread(consumer)
    assert queue.peek("out") == []  # rolled back with the handler
    _run_in_thread(consumer)
    assert [p.message_id for p in queue.peek("out")] == ["r-a"]
    assert queue.peek("q") == []


def test_a_handlers_driver_error_reaches_permanent_errors_untranslated(queue: SqlQueue) -> None:
    """permanent_errors=(IntegrityError,) matches the handler's own IntegrityError (item 7)."""
    from sqlalchemy.exc import IntegrityError

    _make_ledger(queue)
    with queue.engine.begin() as conn:
        conn.execute(text("INSERT INTO ledger VALUES ('taken')"))

    def handler(_m: ReceivedMessage, conn: Connection) -> None:
        conn.execute(text("INSERT INTO ledger VALUES ('taken')"))  # a duplicate key

    send(queue, "a")
    Consumer(queue, "q", handler, permanent_errors=(IntegrityError,)).run_once()
    [dl] = queue.list_dead_letters()
    assert dl.reason == "IntegrityError"
    assert queue.peek("q") == []


def test_run_forever_backs_off_while_the_queue_is_unavailable(
    queue: SqlQueue, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The shared run loop: a retryable error waits 1 s, 2 s ... by the clock (no sleeping), and
    the consumer carries on once the queue is back."""
    from outbox.core.errors import QueueUnavailableError

    send(queue, "a")
    real_receive = queue.receive
    attempts: list[float] = []
    start = clock.now()

    def flaky(*a: Any, **kw: Any) -> Any:
        attempts.append((clock.now() - start).total_seconds())
        if len(attempts) <= 2:
            raise QueueUnavailableError("database is locked")
        return real_receive(*a, **kw)

    queue.receive = flaky  # type: ignore[method-assign]
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        consumer.stop()

    consumer = Consumer(queue, "q", handler, poll_interval=1.0)
    with caplog.at_level("WARNING", logger="outbox.queue.consumer"):
        consumer.run_forever()
    assert consumer.processed == 1
    assert attempts == [0, 1, 3]
    assert [r.getMessage() for r in caplog.records] == [
        "queue unavailable, retrying in 1.0s: database is locked",
        "queue unavailable, retrying in 2.0s: database is locked",
    ]


def test_run_forever_raises_an_error_that_is_not_retryable(queue: SqlQueue) -> None:
    from outbox.core.errors import QueueError

    def broken(*_a: Any, **_kw: Any) -> Any:
        raise QueueError("permission denied")

    queue.receive = broken  # type: ignore[method-assign]
    with pytest.raises(QueueError, match="permission denied"):
        Consumer(queue, "q", print).run_forever()

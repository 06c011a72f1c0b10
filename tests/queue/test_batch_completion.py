"""The consumer completes in batches after its handlers (``dispatcher.queue.completer``): never
before a handler returned, at most one batch handled but not completed, a waiting message's lock
renewed, one lost lock costing only its own message, session order kept with prefetch, and the
batch received ahead abandoned on stop. Each on SQLite and PostgreSQL (the ``queue`` fixture)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.lock_renewer import LockRenewer
from dispatcher.queue.messages import ReceivedMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import OutboxError

#: Seconds a test waits for another thread before calling it hung (only a hang reaches it).
HANG = 60.0


def send(queue: SqlQueue, *mids: str, session: str | None = None) -> None:
    queue.send(
        "q", [QueueMessage(mid.encode(), message_id=mid, session_id=session) for mid in mids]
    )


class Died(BaseException):
    """The process ends here: nothing after it runs (as after a SIGKILL)."""


class _Looks:
    """Counts the lock renewer's looks (each lists what is held, then renews what is due)."""

    def __init__(self) -> None:
        self.count = 0
        self._seen = threading.Condition()

    def seen(self) -> None:
        with self._seen:
            self.count += 1
            self._seen.notify_all()

    def wait_for(self, count: int) -> bool:
        with self._seen:
            return self._seen.wait_for(lambda: self.count >= count, HANG)


def test_a_handler_held_on_an_event_leaves_its_message_locked_and_uncompleted(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """Even with a batch of one (a flush per handled message), the message stays in the queue,
    locked, for as long as its handler runs."""
    send(queue, "a")
    started, release = threading.Event(), threading.Event()

    def handler(_m: ReceivedMessage) -> None:
        started.set()
        release.wait(HANG)

    consumer = Consumer(queue, "q", handler, complete_batch=1)
    running = threading.Thread(target=consumer.run_once)
    running.start()
    try:
        assert started.wait(HANG)
        assert [p.state for p in queue.peek("q")] == ["locked"]
    finally:
        release.set()
        running.join(HANG)
    assert queue.stats() == {}  # completed once the handler returned
    assert consumer.completer.completed == 1


def test_a_dead_process_repeats_only_its_unflushed_messages_never_more_than_a_batch(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """Batches of 5, twelve messages; the process dies in the twelfth handler. The flushes
    after the fifth and the tenth completed those; after the locks run out, only the eleventh
    (handled, waiting for its batch) and the twelfth come back."""
    mids = [f"m{i:02}" for i in range(12)]
    send(queue, *mids)
    handled: list[str] = []

    def handler(m: ReceivedMessage) -> None:
        if m.message_id == "m11":
            raise Died
        handled.append(m.message_id)

    consumer = Consumer(queue, "q", handler, complete_batch=5)
    with pytest.raises(Died):
        consumer.run_once()
    assert handled == mids[:11]
    clock.advance(31)  # the dead process's locks ran out
    back = [m.message_id for m in queue.receive("q", 20)]
    again = [mid for mid in back if mid in handled]  # handled once, and delivered again
    assert len(again) <= 5
    assert again == ["m10"]
    assert back == ["m10", "m11"]


def test_a_message_awaiting_its_completion_is_renewed_past_half_its_lock(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """ "a" is handled and waits for its batch while "b"'s handler runs 31 s on 30 s locks:
    a's lock is renewed with the running one's, so nobody else can take "a"."""
    send(queue, "a", "b")
    looks = _Looks()
    track = LockRenewer._track

    def counted(self: LockRenewer) -> Any:
        out = track(self)
        looks.seen()
        return out

    renewed: list[str] = []
    original = queue.renew_lock

    def spy(m: Any) -> Any:
        out = original(m)
        renewed.append(m.message_id)
        return out

    queue.renew_lock = spy  # type: ignore[method-assign,assignment]
    stolen: list[str] = []
    waited: list[bool] = []

    def handler(m: ReceivedMessage) -> None:
        if m.message_id != "b":
            return  # "a": handled, now waiting for its completion
        clock.advance(20)  # past half of a's lock
        # a look that began after the advance has ended: looks list, then renew what is due
        waited.append(looks.wait_for(looks.count + 3))
        clock.advance(11)  # a's first lock has run out by now
        stolen.extend(m.message_id for m in queue.receive("q"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LockRenewer, "_track", counted)
        consumer = Consumer(queue, "q", handler, renew_check_interval=0.01)
        assert consumer.run_once() == 2
    assert waited == [True], "the renewer did not look"
    assert "a" in renewed
    assert stolen == []
    assert queue.stats() == {}


def test_a_flush_with_one_lost_lock_completes_the_rest(
    queue: SqlQueue, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """ "a"'s lock is lost while it waits (abandoned under it, as a lock that ran out would be):
    the one flush statement completes "b" and "c", leaves "a" to be redelivered and says so."""
    send(queue, "a", "b", "c")
    held: dict[str, ReceivedMessage] = {}

    def handler(m: ReceivedMessage) -> None:
        held[m.message_id] = m
        if m.message_id == "c":
            queue.abandon(held["a"])

    deletes: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement.startswith("DELETE FROM outbox_queue_messages"):
            deletes.append(statement)

    event.listen(queue.engine, "before_cursor_execute", count)
    consumer = Consumer(queue, "q", handler)
    with caplog.at_level("WARNING", logger="outbox.queue.consumer"):
        assert consumer.run_once() == 3
    event.remove(queue.engine, "before_cursor_execute", count)
    assert [(p.message_id, p.state) for p in queue.peek("q")] == [("a", "active")]
    assert len(deletes) == 1  # one statement for the batch
    assert (consumer.completer.completed, consumer.completer.lost) == (2, 1)
    assert "message a: its lock was lost before its completion" in caplog.text


def test_prefetch_never_hands_out_a_sessions_next_message_while_its_predecessor_awaits(
    queue: SqlQueue, clock: ManualClock
) -> None:
    """Receives of two, the next received while one runs, handled messages completed only when
    the loop has nothing more in hand: "a2" comes only after "a1" is gone from the queue."""
    send(queue, "a1", "a2", session="A")
    send(queue, "b1", "b2", "b3", "b4", "b5")
    total = 7
    seen: list[tuple[str, set[str]]] = []
    guard = threading.Lock()
    consumer: Consumer

    def handler(m: ReceivedMessage) -> None:
        present = {p.message_id for p in queue.peek("q", 100)}
        with guard:
            seen.append((m.message_id, present))
            if len(seen) == total:
                consumer.stop()

    consumer = Consumer(
        queue, "q", handler, concurrency=2, max_messages=2, poll_interval=0.01, prefetch=True
    )
    consumer.run_forever()
    order = [mid for mid, _ in seen]
    assert sorted(order) == sorted(["a1", "a2", "b1", "b2", "b3", "b4", "b5"])
    assert order.index("a1") < order.index("a2")
    [present_at_a2] = [present for mid, present in seen if mid == "a2"]
    assert "a1" not in present_at_a2  # completed before its successor was handed out
    assert queue.stats() == {}
    assert consumer.completer.completed == total


def test_stop_abandons_the_batch_received_ahead_and_completes_the_handled(
    queue: SqlQueue, clock: ManualClock
) -> None:
    send(queue, "m1", "m2", "m3", "m4")
    real_receive = queue.receive
    receives: list[list[str]] = []
    ahead_taken = threading.Event()

    def spy(*args: Any, **kwargs: Any) -> Any:
        got = real_receive(*args, **kwargs)
        receives.append([m.message_id for m in got])
        if len(receives) == 2:
            ahead_taken.set()
        return got

    queue.receive = spy  # type: ignore[method-assign]
    consumer: Consumer

    def handler(m: ReceivedMessage) -> None:
        if m.message_id == "m1":
            ahead_taken.wait(HANG)  # the next batch was received while this one ran
            consumer.stop()

    consumer = Consumer(queue, "q", handler, concurrency=2, max_messages=2, poll_interval=0.01)
    consumer.run_forever()
    assert receives == [["m1", "m2"], ["m3", "m4"]]
    assert consumer.processed == 2
    left = [(p.message_id, p.state) for p in queue.peek("q")]
    assert left == [("m3", "active"), ("m4", "active")]  # released now, not when locks run out


def test_one_thread_runs_the_handlers_in_line(queue: SqlQueue) -> None:
    send(queue, "a", "b")
    threads: list[threading.Thread] = []
    consumer = Consumer(queue, "q", lambda _m: threads.append(threading.current_thread()))
    assert consumer.run_once() == 2
    assert threads == [threading.current_thread()] * 2
    assert queue.stats() == {}


@pytest.mark.parametrize("bad", [{"complete_batch": 0}, {"complete_delay": -1.0}])
def test_bad_completion_options_are_refused(queue: SqlQueue, bad: dict[str, Any]) -> None:
    with pytest.raises(OutboxError, match=next(iter(bad))):
        Consumer(queue, "q", print, **bad)

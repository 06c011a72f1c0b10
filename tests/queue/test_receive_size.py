"""The consumer's receives grow while the queue is deep and the handlers quick, and fall back to
the base when the queue runs short or a batch is slow (``dispatcher.queue.receive_size``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.messages import ReceivedMessage
from dispatcher.queue.receive_size import GROWN, QUICK, ReceiveSize
from outbox.core.clock import ManualClock


def _fill(queue: SqlQueue, n: int, start: int = 0) -> None:
    for first in range(start, start + n, 100):
        last = min(first + 100, start + n)
        queue.send("q", [QueueMessage(b"x", message_id=f"m{i}") for i in range(first, last)])


def _asked(queue: SqlQueue) -> list[int]:
    """Record what each receive asks for (the queue answers as ever)."""
    asked: list[int] = []
    receive = queue.receive

    def spy(name: str, max_messages: int = 1, **kw: Any) -> list[ReceivedMessage]:
        asked.append(max_messages)
        return receive(name, max_messages, **kw)

    queue.receive = spy  # type: ignore[method-assign]
    return asked


def _drain(
    queue: SqlQueue, n: int, on_message: Callable[[int], None] = lambda i: None, **kw: Any
) -> Consumer:
    """``run_forever`` until ``n`` messages were handled (the last handler stops it)."""
    handled = 0
    lock = threading.Lock()  # handlers may run on threads
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        nonlocal handled
        with lock:
            handled += 1
            i = handled
        on_message(i)
        if i == n:
            consumer.stop()

    consumer = Consumer(queue, "q", handler, poll_interval=0.01, **kw)
    consumer.run_forever()
    assert handled == n
    return consumer


def test_receives_double_while_the_queue_is_deep_and_the_handlers_quick(queue: SqlQueue) -> None:
    _fill(queue, 500)
    asked = _asked(queue)
    _drain(queue, 500)
    # 16 + 32 + 64 + 100 x 3 = 412; the fourth 100 comes back with 88: short, the end
    assert asked[:7] == [16, 32, 64, GROWN, GROWN, GROWN, GROWN]
    assert queue.stats() == {}


def test_with_handlers_on_threads_the_receive_ahead_grows_too(queue: SqlQueue) -> None:
    """Four handlers, prefetch: the next batch is received while one runs, so it asks for the
    size known before that batch's handlers returned (one step behind)."""
    _fill(queue, 500)
    asked = _asked(queue)
    _drain(queue, 500, concurrency=4)
    assert asked[:6] == [16, 16, 32, 64, GROWN, GROWN]
    assert queue.stats() == {}


def test_a_slow_batch_keeps_receives_at_the_base(queue: SqlQueue, clock: ManualClock) -> None:
    _fill(queue, 200)
    asked = _asked(queue)
    # 16 handlers of 0.01 s: a batch takes 0.16 s, longer than QUICK
    _drain(queue, 200, lambda _i: clock.advance(QUICK / 10 + 0.0001))
    assert set(asked) == {16}


def test_a_short_receive_starts_again_from_the_base(queue: SqlQueue) -> None:
    _fill(queue, 58)  # 16 + 32, then a receive of 64 gets 10: short

    def more(i: int) -> None:
        if i == 58:
            _fill(queue, 50, start=58)  # the next receive asks for 16 again

    asked = _asked(queue)
    _drain(queue, 108, more)
    assert asked[:6] == [16, 32, 64, 16, 32, 64]


def test_a_named_max_messages_is_kept_as_it_is(queue: SqlQueue) -> None:
    _fill(queue, 200)
    asked = _asked(queue)
    _drain(queue, 200, max_messages=16)
    assert set(asked) == {16}


def test_concurrency_above_the_grown_size_is_the_size() -> None:
    size = ReceiveSize(150, grows=True)
    size.received(150, 150)
    size.handled(0.0)
    assert (size.top, size.size) == (150, 150)
    size.received(150, 3)
    assert size.size == 150

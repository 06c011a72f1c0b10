"""The helpers the worker and the consumer share (review item 13)."""

from __future__ import annotations

import signal
import threading

from dispatcher.commands import ProcessDocument
from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import ManualClock
from outbox.core.runloop import stop_on_signals


def test_backoff_has_replayable_jitter() -> None:
    plain = ExponentialBackoff(base=1, cap=10)
    assert [plain(n) for n in (1, 2, 3, 9)] == [1.0, 2.0, 4.0, 10.0]
    a, b = (ExponentialBackoff(base=1, jitter=0.1, seed=7) for _ in range(2))
    delays = [a(n) for n in (1, 2, 3)]
    assert delays == [b(n) for n in (1, 2, 3)]
    assert all(
        2 ** (n - 1) <= d < 2 ** (n - 1) * 1.1 for n, d in zip((1, 2, 3), delays, strict=True)
    )


def test_a_second_signal_gets_the_default_handling() -> None:
    assert threading.current_thread() is threading.main_thread()
    # as in a terminal: a pytest-xdist worker starts with SIGINT ignored, and "the default
    # handling" restores what was there before
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _second_signal_gets_default_handling()
    finally:
        signal.signal(signal.SIGINT, previous)


def _second_signal_gets_default_handling() -> None:
    stopped = threading.Event()
    interrupted = False
    with stop_on_signals(stopped.set) as state:
        signal.raise_signal(signal.SIGTERM)  # handled synchronously in the main thread
        assert stopped.is_set()
        assert state.received == "SIGTERM"
        try:
            signal.raise_signal(signal.SIGINT)  # the second: Python's own KeyboardInterrupt
        except KeyboardInterrupt:
            interrupted = True
    assert interrupted
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_scheduled_command_message() -> None:
    when = ManualClock().now()
    m = ProcessDocument("t", "doc", 3).to_queue_message(not_before=when)
    assert (m.not_before, m.session_id) == (when, "doc")
    assert ProcessDocument("t", "doc", 3).to_queue_message().not_before is None

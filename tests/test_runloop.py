"""The shared run loop (``outbox.core.runloop``): idle waits and error backoff on the injected
clock, fatal errors, graceful stop on the first SIGTERM/SIGINT, default handling of the second,
and the ``once`` / ``until_idle`` / ``max_iterations`` modes."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import ManualClock, SystemClock
from outbox.core.errors import QueueError, QueueUnavailableError, ValidationError
from outbox.core.runloop import TICK, RunLoop


class Script:
    """A poll that plays a script: each step is a return value or an exception to raise; it notes
    the clock at every call. Past the script's end it stops the loop (so a test cannot hang)."""

    def __init__(self, clock: ManualClock, *steps: int | bool | Exception) -> None:
        self.clock = clock
        self.steps: Iterator[int | bool | Exception] = iter(steps)
        self.calls: list[datetime] = []
        self.loop: RunLoop | None = None

    def __call__(self) -> int | bool:
        self.calls.append(self.clock.now())
        step = next(self.steps, None)
        if step is None:
            assert self.loop is not None
            self.loop.stop()
            return 0
        if isinstance(step, Exception):
            raise step
        return step

    def gaps(self) -> list[float]:
        """Seconds between consecutive polls."""
        return [(b - a).total_seconds() for a, b in itertools.pairwise(self.calls)]


def make_loop(
    clock: ManualClock, *steps: int | bool | Exception, **options: Any
) -> tuple[RunLoop, Script]:
    script = Script(clock, *steps)
    loop = RunLoop(script, clock=clock, **{"idle_wait": 5.0, **options})
    script.loop = loop
    return loop, script


# --- waiting on the clock -----------------------------------------------------------------------


def test_work_polls_again_at_once_and_an_idle_poll_waits(clock: ManualClock) -> None:
    loop, script = make_loop(clock, 3, 0, 0, True, 0)
    result = loop.run()
    assert script.gaps() == [0, 5, 5, 0, 5]
    assert (result.iterations, result.work, result.idle_polls, result.ended) == (6, 4, 3, "stopped")


def test_a_long_idle_wait_is_taken_in_ticks_so_a_stop_is_seen_between_them() -> None:
    class CountingClock(ManualClock):
        def __init__(self) -> None:
            super().__init__()
            self.sleeps: list[float] = []

        def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            super().sleep(seconds)

    clock = CountingClock()
    loop, script = make_loop(clock, 0, 0, idle_wait=2.5 * TICK)
    loop.run()
    assert script.gaps() == [2.5 * TICK, 2.5 * TICK]
    assert clock.sleeps == [TICK, TICK, 0.5 * TICK] * 2


def test_a_periodic_loop_counts_its_wait_from_the_start_of_the_poll(clock: ManualClock) -> None:
    calls: list[datetime] = []

    def slow_pass() -> int:
        calls.append(clock.now())
        clock.advance(2)  # the pass itself takes 2 s
        return 0

    RunLoop(slow_pass, clock=clock, idle_wait=30, periodic=True).run(max_iterations=3)
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(calls)] == [30, 30]


def test_stop_ends_a_wait_on_the_real_clock_at_once() -> None:
    polled = threading.Event()

    def poll() -> int:
        polled.set()
        return 0

    loop = RunLoop(poll, clock=SystemClock(), idle_wait=3600)
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(loop.run()))
    t.start()
    assert polled.wait(10)
    loop.stop()
    t.join(10)
    assert not t.is_alive(), "the loop kept waiting after stop()"
    assert results[0].ended == "stopped"


# --- errors -------------------------------------------------------------------------------------


def test_retryable_errors_back_off_and_the_backoff_resets_after_a_success(
    clock: ManualClock,
) -> None:
    down = QueueUnavailableError("database is locked")
    seen: list[tuple[str, float]] = []
    loop, script = make_loop(
        clock,
        down,
        down,
        down,
        1,
        down,
        0,
        error_backoff=ExponentialBackoff(base=1, cap=100),
        on_error=lambda e, delay: seen.append((str(e), delay)),
    )
    result = loop.run()
    #            1st 2nd 3rd error, success (work), error again: from 1 s, then idle
    assert script.gaps() == [1, 2, 4, 0, 1, 5]
    assert [d for _, d in seen] == [1, 2, 4, 1]
    assert seen[0][0] == "database is locked"
    assert result.errors == 4


def test_the_default_error_backoff_doubles_from_the_idle_wait(clock: ManualClock) -> None:
    down = QueueUnavailableError("down")
    loop, script = make_loop(clock, *[down] * 7, idle_wait=2.0, on_error=lambda e, d: None)
    loop.run()
    assert script.gaps() == [2, 4, 8, 16, 30, 30, 30]


@pytest.mark.parametrize(
    "fatal",
    [QueueError("permission denied"), RuntimeError("a bug"), ValueError("bad")],
    ids=["not-retryable-outbox-error", "runtime-error", "value-error"],
)
def test_a_fatal_error_stops_the_loop_and_is_raised(clock: ManualClock, fatal: Exception) -> None:
    loop, script = make_loop(clock, 1, fatal, 1)
    with pytest.raises(type(fatal)) as raised:
        loop.run()
    assert raised.value is fatal
    assert len(script.calls) == 2  # nothing after the fatal error


def test_the_caller_decides_what_is_retryable(clock: ManualClock) -> None:
    """The rescuer's scheduler retries every ``Exception``: one bad pass must not end I5."""
    failures: list[Exception] = []
    loop, script = make_loop(
        clock,
        RuntimeError("driver hiccup"),
        0,
        retryable=lambda e: True,
        error_backoff=lambda n: 30,
        on_error=lambda e, d: failures.append(e),
    )
    loop.run()
    assert [str(e) for e in failures] == ["driver hiccup"]
    assert script.gaps() == [30, 5]


def test_base_exceptions_pass_through(clock: ManualClock) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RunLoop(interrupted, clock=clock, idle_wait=1, retryable=lambda e: True).run()


# --- modes --------------------------------------------------------------------------------------


def test_once_drains_what_is_ready_then_ends(clock: ManualClock) -> None:
    loop, script = make_loop(clock, 2, 1, 0, 5)
    result = loop.run(once=True)
    assert (len(script.calls), result.ended, result.work) == (3, "once", 3)
    assert script.gaps() == [0, 0]


def test_once_still_retries_an_error(clock: ManualClock) -> None:
    loop, script = make_loop(clock, QueueUnavailableError("blip"), 1, 0, on_error=lambda e, d: None)
    assert loop.run(once=True).ended == "once"
    assert len(script.calls) == 3


def test_until_idle_waits_until_nothing_is_left_at_all(clock: ManualClock) -> None:
    answers = iter([QueueUnavailableError("stats blip"), False, True])

    def nothing_left() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    loop, script = make_loop(clock, 1, 0, 0, 0, on_error=lambda e, d: None)
    result = loop.run(until_idle=nothing_left)
    # idle -> the check fails (retryable, backoff 5 s); idle -> work scheduled later (wait 5 s);
    # idle -> nothing left: end
    assert (result.ended, len(script.calls), result.errors) == ("idle", 4, 1)
    assert script.gaps() == [0, 5, 5]


def test_max_iterations_counts_every_poll_and_does_not_wait_after_the_last(
    clock: ManualClock,
) -> None:
    loop, script = make_loop(clock, 0, 1, 0, 0, 0)
    start = clock.now()
    result = loop.run(max_iterations=3)
    assert (result.ended, len(script.calls)) == ("max_iterations", 3)
    assert (clock.now() - start).total_seconds() == 5  # one idle wait, none after the 3rd poll
    with pytest.raises(ValidationError):
        loop.run(max_iterations=0)


def test_a_stop_asked_during_a_poll_lets_it_finish_then_ends_the_loop(
    clock: ManualClock,
) -> None:
    finished: list[str] = []
    loop: RunLoop

    def poll() -> int:
        loop.stop()
        finished.append("done")  # the poll in hand is not cut short
        return 1

    loop = RunLoop(poll, clock=clock, idle_wait=1)
    assert loop.run().ended == "stopped"
    assert finished == ["done"]
    assert loop.run().iterations == 0  # a stop is for good


def test_a_shared_stop_event_stops_every_loop_that_has_it(clock: ManualClock) -> None:
    stop = threading.Event()
    first = RunLoop(lambda: 0, clock=clock, idle_wait=1, stop_event=stop)
    second = RunLoop(lambda: 0, clock=clock, idle_wait=1, stop_event=stop)
    first.stop()
    assert second.stopping
    assert second.run(handle_signals=False).iterations == 0


# --- signals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_first_signal_drains_and_stops(clock: ManualClock, signum: signal.Signals) -> None:
    assert threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    polls: list[str] = []

    def poll() -> int:
        polls.append("start")
        if polls.count("start") == 2:
            signal.raise_signal(signum)  # handled synchronously, in the main thread
        polls.append("end")
        return 1

    result = RunLoop(poll, clock=clock, idle_wait=1).run()
    assert polls == ["start", "end", "start", "end"]  # the signalled poll finished
    assert (result.signal, result.ended, result.iterations) == (signum.name, "stopped", 2)
    assert {s: signal.getsignal(s) for s in before} == before  # handlers put back


def test_without_handle_signals_the_loop_installs_nothing(clock: ManualClock) -> None:
    seen: list[Callable[..., Any] | int | None] = []

    def poll() -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    before = signal.getsignal(signal.SIGTERM)
    RunLoop(poll, clock=clock, idle_wait=1).run(once=True, handle_signals=False)
    assert seen == [before]


_CHILD = """
import signal, sys, threading
from outbox.core.clock import SystemClock
from outbox.core.runloop import RunLoop

# Ctrl-C as in a terminal: a process started under pytest-xdist inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
second = sys.argv[1] == "second"
stop = threading.Event()


def poll():
    sys.stderr.write("polling\\n")
    sys.stderr.flush()
    stop.wait()  # the work in hand; the first signal asks the loop to stop
    sys.stderr.write("asked to stop, finishing the poll\\n")
    sys.stderr.flush()
    if second:
        threading.Event().wait()  # still busy: only the second signal can end this
    return 1


try:
    result = RunLoop(poll, clock=SystemClock(), idle_wait=60, stop_event=stop).run()
except KeyboardInterrupt:
    sys.stderr.write("KeyboardInterrupt\\n")
    sys.exit(130)
sys.stderr.write(f"stopped by {result.signal} after {result.iterations} poll(s)\\n")
"""


def _child(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_real_process_drains_on_the_first_signal(signum: signal.Signals) -> None:
    proc = _child("first")
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "polling\n"
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert err.splitlines() == [
        "asked to stop, finishing the poll",
        f"stopped by {signum.name} after 1 poll(s)",
    ]


@pytest.mark.parametrize(
    ("first", "second", "returncode"),
    [
        (signal.SIGTERM, signal.SIGTERM, -signal.SIGTERM),  # the default: the process ends
        (signal.SIGINT, signal.SIGINT, 130),  # Python's default: KeyboardInterrupt
        (signal.SIGTERM, signal.SIGINT, 130),
        (signal.SIGINT, signal.SIGTERM, -signal.SIGTERM),
    ],
    ids=["TERM-TERM", "INT-INT", "TERM-INT", "INT-TERM"],
)
def test_a_real_process_gets_the_default_handling_on_the_second_signal(
    first: signal.Signals, second: signal.Signals, returncode: int
) -> None:
    proc = _child("second")
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "polling\n"
        proc.send_signal(first)
        # The handlers are put back before the loop is told to stop, so from here on the
        # second signal gets the default handling.
        assert proc.stderr.readline() == "asked to stop, finishing the poll\n"
        proc.send_signal(second)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == returncode, err
    if returncode == 130:
        assert err.splitlines() == ["KeyboardInterrupt"]

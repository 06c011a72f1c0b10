"""One run loop for every long-running component: poll, wait when idle, back off on retryable
errors, stop gracefully on SIGTERM/SIGINT.

Why one: the queue consumer, the command worker and the rescuer scheduler each had a loop of their
own, with different stop, backoff and signal handling (one stopped on SIGTERM only). The gateways
that come next (an MQTT gateway, a Service Bus receiver) get the same behaviour by handing this
loop a ``poll`` callable; the loop knows nothing about queues.

The rules:

* ``poll()`` returns how much it did (a count, or a bool). Something done: poll again at once
  (there may be more). Nothing done: wait ``idle_wait`` seconds first.
* ``poll()`` raising an error that ``retryable(error)`` accepts (by default an ``OutboxError``
  with ``retryable = True``: a database briefly unreachable) is handed to ``on_error`` and retried
  after ``error_backoff(n)`` seconds, ``n`` counting the errors in a row (reset by the first poll
  that does not fail). Any other error is fatal: the loop stops and ``run()`` re-raises it.
  ``BaseException`` (``KeyboardInterrupt``, ``SystemExit``, an injected crash) always passes.
* Stop (``stop()``, or the first SIGTERM/SIGINT while ``run()`` is on the main thread) is honoured
  between polls and during waits, never inside a poll: the work in hand finishes (drains). After the
  first signal the previous handlers are put back, so a second signal is handled the way it was
  before (SIGTERM ends the process, Ctrl-C raises ``KeyboardInterrupt``): an operator who insists
  is not ignored.
* Every wait reads the injected ``Clock``. On the real clock it waits on the stop event (a stop
  ends the wait at once); on any other clock it sleeps in slices of at most ``TICK`` seconds,
  checking for a stop in between, so a ``ManualClock`` test skips ahead instead of sleeping.
* A component with several loops (the command worker's threads, the MQTT gateway's slots) runs
  them with ``run_loops``: the signals handled once for all, and one loop's fatal error stops the
  others and is raised when every loop has ended.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import OutboxError, ValidationError
from outbox.core.health import beat

log = logging.getLogger("outbox.runloop")

#: Longest single wait on a clock that is not the real one, so a stop is noticed between slices.
TICK = 1.0
#: Longest wait after retryable errors in a row, unless the caller passes its own backoff.
MAX_ERROR_WAIT = 30.0
#: The signals that ask a loop to stop.
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How long the main thread waits on a loop's thread at a time, so it still runs signal handlers.
JOIN_SLICE = 0.2

#: One unit of work: how much it did (0 or False: nothing, so the loop waits before the next).
Poll = Callable[[], int | bool]


def retryable_outbox_error(error: Exception) -> bool:
    """The default test: our own error tree says whether a retry can succeed."""
    return isinstance(error, OutboxError) and error.retryable


def _log_retry(error: Exception, delay: float) -> None:
    log.warning("poll failed, retrying in %.1fs: %s", delay, error)


# --- signals ----------------------------------------------------------------------------------


@dataclass
class SignalState:
    """What ``stop_on_signals`` saw: the name of the signal that asked to stop, if any."""

    received: str | None = None


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[SignalState]:
    """Within the block, the first SIGTERM or SIGINT calls ``stop()`` and puts the previous handlers
    back, so a second signal gets the handling that was there before. Off the main thread (where
    Python cannot install handlers) it does nothing. The previous handlers are restored on exit."""
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous: dict[int, Any] = {}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        log.info("received %s: finishing the work in hand, then stopping", name)
        state.received = name
        restore()  # a second signal: the handling from before
        stop()

    for s in SIGNALS:
        previous[s] = signal.signal(s, handler)
    try:
        yield state
    finally:
        restore()


# --- the loop ---------------------------------------------------------------------------------


@dataclass
class LoopResult:
    """How a ``run()`` went."""

    #: Polls started (failed ones included).
    iterations: int = 0
    #: The sum of what the polls returned.
    work: int = 0
    #: Polls that did nothing.
    idle_polls: int = 0
    #: Retryable errors survived.
    errors: int = 0
    #: Why the loop ended: "stopped", "once", "idle" or "max_iterations".
    ended: str = ""
    #: The signal that asked to stop ("SIGTERM", "SIGINT"), if one did.
    signal: str | None = None


class RunLoop:
    """Calls ``poll`` until stopped; see the module docstring for the rules."""

    def __init__(  # noqa: PLR0913 - keyword-only options, each with a default
        self,
        poll: Poll,
        *,
        clock: Clock,
        idle_wait: float,
        error_backoff: Callable[[int], float] | None = None,
        retryable: Callable[[Exception], bool] = retryable_outbox_error,
        on_error: Callable[[Exception, float], None] = _log_retry,
        periodic: bool = False,
        stop_event: threading.Event | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        """``periodic``: waits count from the start of the poll, not its end (a scheduler that
        starts a pass every ``idle_wait`` seconds, however long a pass takes). ``stop_event``:
        share one stop between several loops (a worker's threads) or with the owner's own checks.
        ``wake``: set by another thread when there is work (a gateway's incoming acks), it ends an
        idle wait early; the owner's ``stop`` should set it too.
        ``error_backoff`` defaults to doubling from ``idle_wait`` up to ``MAX_ERROR_WAIT``."""
        if idle_wait < 0:
            raise ValidationError(f"idle_wait {idle_wait!r} must not be negative")
        self.poll = poll
        self.clock = clock
        self.idle_wait = idle_wait
        self.error_backoff = error_backoff or ExponentialBackoff(
            base=idle_wait, cap=max(idle_wait, MAX_ERROR_WAIT)
        )
        self.retryable = retryable
        self.on_error = on_error
        self.periodic = periodic
        self._stop = stop_event if stop_event is not None else threading.Event()
        self._wake = wake

    def stop(self) -> None:
        """Stop before the next poll (or now, if waiting); a poll in progress finishes."""
        self._stop.set()
        if self._wake is not None:
            self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(
        self,
        *,
        once: bool = False,
        until_idle: Callable[[], bool] | None = None,
        max_iterations: int | None = None,
        handle_signals: bool = True,
    ) -> LoopResult:
        """Poll until stopped; returns how it went, or raises the first fatal error.

        ``once``: end at the first poll that does nothing (drain what is ready now).
        ``until_idle``: at each poll that does nothing, end if ``until_idle()`` says there is
        nothing left at all (not even scheduled work); it may raise like ``poll``.
        ``max_iterations``: end after that many polls. ``handle_signals``: SIGTERM/SIGINT stop
        the loop (main thread only); turn it off when the caller handles them for several loops.
        """
        if max_iterations is not None and max_iterations < 1:
            raise ValidationError(f"max_iterations {max_iterations!r} must be at least 1")
        result = LoopResult()
        guard = stop_on_signals(self.stop) if handle_signals else nullcontext(SignalState())
        with guard as signals:
            try:
                result.ended = self._run(result, once, until_idle, max_iterations)
            finally:
                result.signal = signals.received
        return result

    def _run(
        self,
        result: LoopResult,
        once: bool,
        until_idle: Callable[[], bool] | None,
        max_iterations: int | None,
    ) -> str:
        errors_in_a_row = 0
        while not self.stopping:
            started = self.clock.now()
            beat()  # liveness (outbox.core.health): a poll that never returns stops the beats
            result.iterations += 1
            try:
                done = self.poll()
                result.work += int(done)
                if self.stopping:
                    return "stopped"
                if done:
                    wait = 0.0
                else:
                    result.idle_polls += 1
                    if once:
                        return "once"
                    if until_idle is not None and until_idle():
                        return "idle"
                    wait = self.idle_wait
                errors_in_a_row = 0
            except Exception as e:
                if not self.retryable(e):
                    raise
                errors_in_a_row += 1
                result.errors += 1
                wait = self.error_backoff(errors_in_a_row)
                self.on_error(e, wait)
            if max_iterations is not None and result.iterations >= max_iterations:
                return "max_iterations"
            beat(wait)  # back within the wait: alive meanwhile
            if wait > 0:
                self.wait_until((started if self.periodic else self.clock.now()), wait)
        return "stopped"

    def wait_until(self, since: datetime, seconds: float) -> None:
        """Wait until ``seconds`` after ``since`` by the clock, or until stopped."""
        deadline = since + timedelta(seconds=seconds)
        while not self.stopping:
            left = (deadline - self.clock.now()).total_seconds()
            if left <= 0:
                return
            if self._wake is not None and self._wake.is_set():
                self._wake.clear()  # work came in: poll again now
                return
            if isinstance(self.clock, SystemClock):
                (self._wake or self._stop).wait(left)
            else:
                self.clock.sleep(min(left, TICK))


# --- several loops ----------------------------------------------------------------------------


def run_loops(
    n: int,
    make_loop: Callable[[], RunLoop],
    stop: Callable[[], None],
    *,
    handle_signals: bool = True,
    name: str = "outbox-loop",
    once: bool = False,
    until_idle: Callable[[], bool] | None = None,
    ready: Callable[[], None] | None = None,
) -> str | None:
    """Run ``n`` loops made by ``make_loop`` (one on the calling thread, several in threads named
    ``{name}-{i}``) until every one has ended; returns the signal that asked to stop, if one did.

    Why here: the command worker and the MQTT gateway both run several loops, and both need the
    signals handled once for all (a thread cannot install handlers) and a loop's fatal error to
    stop the others (``stop`` stops them all) and be raised once they have ended, so a component
    never keeps running with dead threads. ``ready`` runs once the handlers are in place.
    """
    failures: list[BaseException] = []
    guard = threading.Lock()

    def one() -> None:
        try:
            make_loop().run(once=once, until_idle=until_idle, handle_signals=False)
        except BaseException as e:  # raised below; the other loops stop too
            with guard:
                failures.append(e)
                first = len(failures) == 1
            if not first and isinstance(e, Exception):  # only the first one is raised
                log.warning("%s also failed: %s", threading.current_thread().name, e)
            stop()

    signals = stop_on_signals(stop) if handle_signals else nullcontext(SignalState())
    with signals as state:
        if ready is not None:
            ready()
        if n == 1:
            one()
        else:
            threads = [
                threading.Thread(target=one, name=f"{name}-{i}", daemon=True) for i in range(n)
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(JOIN_SLICE)
    if failures:
        raise failures[0]
    return state.received

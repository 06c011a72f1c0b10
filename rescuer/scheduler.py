"""``outbox rescue --every 30s``: run passes on a fixed period until SIGTERM (or Ctrl-C).

Why a loop of our own and not cron: a pass is cheap (tens of ms on the feed), so a resident loop
keeps the engine warm (one SparkSession, one open Delta handle) and bounds rescue time by
delay + interval (invariant I5). All waiting goes through the clock, so tests step time instead
of sleeping. A stop request is honoured between passes, never in the middle of one: a pass either
finishes (checkpoint advanced) or was not started.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from outbox.core.clock import Clock
from outbox.core.errors import OutboxError
from rescuer.runner import PassReport, RescuePass

log = logging.getLogger("outbox.rescuer")

#: Longest single wait, so a stop request is noticed quickly even with a long interval.
TICK = 1.0


class Scheduler:
    def __init__(
        self,
        rescue: RescuePass,
        *,
        every: float,
        clock: Clock,
        on_report: Callable[[PassReport], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        if every <= 0:
            raise ValueError("every must be positive")
        self.rescue = rescue
        self.every = every
        self.clock = clock
        self.on_report = on_report
        self.on_error = on_error
        self.stop_event = threading.Event()
        self.passes = 0
        self.failures = 0
        #: Failures that were not ``OutboxError``s (a driver error nobody translated, a bug).
        self.unexpected = 0

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, *, full_first: bool = False, max_passes: int | None = None) -> int:
        """Run until ``stop()`` (or ``max_passes``); returns the number of passes run.

        A pass that fails with an ``OutboxError`` (queue down, feed error) is reported and
        retried on the next tick: the checkpoint did not move, so nothing is lost. Any other
        ``Exception`` (a driver error that escaped translation, a bug) is the last resort: it is
        logged with its type, counted in ``unexpected`` and retried the same way, because one
        bad pass must not stop the loop that bounds rescue time (I5). ``KeyboardInterrupt`` and
        ``SystemExit`` are not ``Exception``s and still stop it.
        """
        full = full_first
        while not self.stop_event.is_set():
            started = self.clock.now()
            try:
                report = self.rescue.run(full=full)
                full = False
                if self.on_report is not None:
                    self.on_report(report)
            except OutboxError as e:
                self.failures += 1
                log.error("rescue pass failed; retrying next tick: %s", e)
                if self.on_error is not None:
                    self.on_error(e)
            except Exception as e:
                self.failures += 1
                self.unexpected += 1
                log.error(
                    "rescue pass failed with an unexpected %s; retrying next tick: %s",
                    type(e).__name__,
                    e,
                )
                log.debug("unexpected rescue pass failure", exc_info=True)
                if self.on_error is not None:
                    self.on_error(e)
            self.passes += 1
            if max_passes is not None and self.passes >= max_passes:
                break
            self._wait_until(started.timestamp() + self.every)
        return self.passes

    def _wait_until(self, deadline: float) -> None:
        while not self.stop_event.is_set():
            left = deadline - self.clock.now().timestamp()
            if left <= 0:
                return
            self.clock.sleep(min(left, TICK))


@contextmanager
def stop_on_sigterm(scheduler: Scheduler) -> Iterator[None]:
    """Route SIGTERM to ``scheduler.stop()`` for the duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_sig: int, _frame: FrameType | None) -> None:
        log.info("SIGTERM: stopping after the current pass")
        scheduler.stop()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

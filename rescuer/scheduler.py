"""``outbox rescue --every 30s``: run passes on a fixed period until SIGTERM or SIGINT.

Why a loop of our own and not cron: a pass is cheap (tens of ms on the feed), so a resident loop
keeps the engine warm (one SparkSession, one open Delta handle) and bounds rescue time by
delay + interval (invariant I5). The loop is the shared ``outbox.core.runloop.RunLoop`` in periodic
mode: all waiting goes through the clock, so tests step time instead of sleeping. A stop request
(``stop()``, or the first SIGTERM/SIGINT) is honoured between passes, never in the middle of one: a
pass either finishes (checkpoint advanced) or was not started. A second signal is handled the
default way (Ctrl-C then interrupts the pass; its checkpoint is not stored).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from outbox.core.clock import Clock
from outbox.core.errors import OutboxError
from outbox.core.runloop import RunLoop
from rescuer.runner import PassReport, RescuePass

log = logging.getLogger("outbox.rescuer")


def _any_exception(_error: Exception) -> bool:
    """Every failed pass is retried: see ``Scheduler.run``."""
    return True


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
        self._full = False

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, *, full_first: bool = False, max_passes: int | None = None) -> int:
        """Run until ``stop()``, SIGTERM/SIGINT (or ``max_passes``); returns the number of passes
        run.

        A pass that fails with an ``OutboxError`` (queue down, feed error) is reported and
        retried on the next tick: the checkpoint did not move, so nothing is lost. Any other
        ``Exception`` (a driver error that escaped translation, a bug) is the last resort: it is
        logged with its type, counted in ``unexpected`` and retried the same way, because one
        bad pass must not stop the loop that bounds rescue time (I5). ``KeyboardInterrupt`` and
        ``SystemExit`` are not ``Exception``s and still stop it.
        """
        self._full = full_first
        loop = RunLoop(
            self._pass,
            clock=self.clock,
            idle_wait=self.every,
            periodic=True,  # a pass starts every `every` seconds, however long the last took
            error_backoff=lambda _n: self.every,  # no growing backoff: it would stretch I5
            retryable=_any_exception,
            on_error=self._failed,
            stop_event=self.stop_event,
        )
        remaining = None if max_passes is None else max(1, max_passes - self.passes)
        loop.run(max_iterations=remaining)
        return self.passes

    def _pass(self) -> int:
        report = self.rescue.run(full=self._full)
        self._full = False
        if self.on_report is not None:
            self.on_report(report)
        self.passes += 1
        return 0  # a pass takes all there is: wait for the next tick

    def _failed(self, e: Exception, _delay: float) -> None:
        self.failures += 1
        if isinstance(e, OutboxError):
            log.error("rescue pass failed; retrying next tick: %s", e)
        else:
            self.unexpected += 1
            log.error(
                "rescue pass failed with an unexpected %s; retrying next tick: %s",
                type(e).__name__,
                e,
            )
            log.debug("unexpected rescue pass failure", exc_info=e)
        if self.on_error is not None:
            self.on_error(e)
        self.passes += 1

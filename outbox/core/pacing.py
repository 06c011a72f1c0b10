"""Holding a bulk operation to a rate: a requeue of 100,000 dead letters at 500 a second must
not swamp a consumer that has just recovered (issue 46, item 3).

Why on the clock's ``sleep``: the clock is injected everywhere (``outbox.core.clock``), so a
test paces on a ``ManualClock`` whose sleep moves its time, and asserts the waits exactly."""

from __future__ import annotations

from outbox.core.clock import Clock
from outbox.core.errors import ValidationError


class Pacer:
    """After each step of ``n`` items, wait until the items so far have taken at least
    ``n / rate`` seconds each since the first step began (a late step is not made up for by
    rushing the next: the rate is a ceiling)."""

    def __init__(self, rate: float, clock: Clock) -> None:
        if not rate > 0:
            raise ValidationError(f"a rate must be above 0, got {rate!r}", hint="e.g. --rate 500")
        self.rate = float(rate)
        self._clock = clock
        self._start = clock.now()
        self._due = 0.0  # seconds the items so far may take at the rate
        self.waited = 0.0

    def step(self, n: int) -> None:
        self._due += n / self.rate
        elapsed = (self._clock.now() - self._start).total_seconds()
        if elapsed > self._due:  # behind: start the budget again from here
            self._start, self._due = self._clock.now(), 0.0
            return
        wait = self._due - elapsed
        if wait > 0:
            self.waited += wait
            self._clock.sleep(wait)

    def chunk(self) -> int:
        """Items per step so a step is at most about a second at the rate (at least one)."""
        return max(1, int(self.rate))

"""Exponential backoff, shared by redelivery delays (the consumer, the command worker) and the
run loop's wait after a retryable error.

Why in the kernel: the queue's consumer, the worker and the run loop all need the same rule, and
none of them may import another for it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from outbox.core.errors import ValidationError


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Delay for attempt ``n`` (1-based): ``base * factor**(n-1)``, capped at ``cap``, plus a
    random 0..``jitter`` fraction of it (so retries of many messages failed together spread out).
    ``seed`` makes the jitter replayable."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.0
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.cap < 0 or self.jitter < 0:
            raise ValidationError(
                f"invalid backoff {self!r}",
                hint="base, cap and jitter must not be negative; factor must be at least 1",
            )
        object.__setattr__(self, "_rng", random.Random(self.seed))

    def __call__(self, attempt: int) -> float:
        try:
            delay = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:  # a long outage: thousands of attempts are past any cap
            delay = self.cap
        if self.jitter:
            delay *= 1 + self.jitter * self._rng.random()
        return float(delay)

"""The settings one ``SqlQueue`` shares between its sender, receiver and administration.

Why one mutable object: the three parts are built once, and ``SqlQueue`` keeps its settings as
assignable attributes (``queue.clock = ...`` worked before the split); each part reads the shared
object at call time, so a change reaches all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.queue import validation
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.errors import ValidationError


@dataclass(slots=True)
class QueueOptions:
    clock: Clock
    lock_duration: timedelta
    max_delivery_count: int
    duplicate_detection_window: timedelta
    max_body_bytes: int

    @classmethod
    def checked(
        cls,
        *,
        clock: Clock | None,
        lock_duration: float,
        max_delivery_count: int,
        duplicate_detection_window: float,
        max_body_bytes: int,
    ) -> QueueOptions:
        """The options, or ``ValidationError`` naming the first bad value."""
        if not 0 < lock_duration <= 300:
            raise ValidationError(f"lock_duration {lock_duration!r}s must be in (0, 300]")
        validation.positive("max_delivery_count", max_delivery_count)
        validation.positive("max_body_bytes", max_body_bytes)
        if duplicate_detection_window < 0:
            raise ValidationError("duplicate_detection_window must not be negative")
        return cls(
            clock=clock or SystemClock(),
            lock_duration=timedelta(seconds=lock_duration),
            max_delivery_count=max_delivery_count,
            duplicate_detection_window=timedelta(seconds=duplicate_detection_window),
            max_body_bytes=max_body_bytes,
        )

    def now(self) -> datetime:
        """The injected clock's time, as UTC (every stored time is UTC)."""
        return utc(self.clock.now())

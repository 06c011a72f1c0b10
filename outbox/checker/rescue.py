"""The rescuer as the checker runs it: the product's ``RescuePass`` in the supervisor, on an
accelerated clock, behind a sink that records what it enqueued and sometimes dies mid-pass.

Time: Delta commit timestamps are real wall time, and the rescuer compares them with its clock's
``now()``. The rescuer here runs on a clock that is ``rescue_delay - COMPRESSED_DELAY`` seconds
ahead of the wall clock, so a commit becomes old enough for the (real, 15 s minimum) delay after
about ``COMPRESSED_DELAY`` real seconds: the pass logic is exactly the product's, only the waiting
is skipped. Reported rescue latencies are real seconds; add the skipped seconds for the
latency a production rescuer with the same delay would show.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from outbox.checker.report import CheckReport
from outbox.core.clock import SystemClock
from outbox.core.errors import OutboxError

log = logging.getLogger("outbox.checker")

COMPRESSED_DELAY = 1.0  # real seconds between a commit and the rescuer seeing it as old enough


class OffsetClock(SystemClock):
    """The wall clock, ``offset`` seconds ahead (the rescuer's accelerated view of time)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)


class InterruptedPass(Exception):
    """Stands for Ctrl-C or a crash in the middle of a rescue pass (after some enqueues)."""


class RecordingSink:
    """Commands into the SQL queue, remembering which documents got a *new* command and when
    (wall time): a worker's first delivery on a document no retry command ever named can only
    have come through one of these."""

    def __init__(self, queue: Any, queue_name: str) -> None:
        self.queue, self.queue_name = queue, queue_name
        self.first_command_at: dict[str, float] = {}  # document id -> wall time

    def enqueue(self, commands: Sequence[Any]) -> int:
        if not commands:
            return 0
        by_id = {c.command_id: c.id for c in commands}
        now = time.time()  # before the send: no worker can have seen the command earlier
        sent = self.queue.send(self.queue_name, [c.to_queue_message() for c in commands])
        for command_id in sent:
            self.first_command_at.setdefault(by_id[command_id], now)
        return len(sent)


class FlakySink:
    """Enqueues part of a pass's commands, then dies, with probability ``rate`` per pass."""

    def __init__(self, inner: Any, rng: random.Random, rate: float) -> None:
        self.inner, self.rng, self.rate = inner, rng, rate
        self.enqueued = 0

    def enqueue(self, commands: Sequence[Any]) -> int:
        if self.rate and self.rng.random() < self.rate:
            self.enqueued += self.inner.enqueue(commands[: len(commands) // 2])
            raise InterruptedPass("rescue pass interrupted after enqueueing half its commands")
        n = int(self.inner.enqueue(commands))
        self.enqueued += n
        return n


def run_rescue_pass(rescuer: Any, report: CheckReport) -> None:
    """One rescue pass, accounted for in ``report``.

    Only failures the product promises to survive are retried by the next pass (as cron or
    ``--every`` would): the checker's own injected interruption and an ``OutboxError`` (the queue
    is down, the feed is gone). Anything else (a raw driver error that escaped translation, a bug
    in the rescuer) is recorded in ``rescue_errors`` and fails the seed, so it cannot hide behind
    the retries.
    """
    report.rescue_passes += 1
    try:
        rescuer.run()
    except InterruptedPass:
        report.rescue_passes_interrupted += 1
    except OutboxError as e:
        report.rescue_passes_failed += 1
        log.warning("rescue pass failed (retried next pass): %s", e)
    except Exception as e:
        report.rescue_errors.append(f"{type(e).__name__}: {e}"[:500])
        log.error("rescue pass raised an unexpected %s: %s", type(e).__name__, e, exc_info=True)

"""The rescuer as the checker runs it: the product's ``RescuePass`` and ``QueueSink`` in the
supervisor, on an accelerated clock, the sink's queue recording what it accepted, and the sink
sometimes dying mid-pass.

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
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from dispatcher.queue.messages import QueueMessage
from outbox.app.checker.report import CheckReport
from outbox.core.clock import SystemClock
from outbox.core.errors import OutboxError

log = logging.getLogger("outbox.app.checker")

COMPRESSED_DELAY = 1.0  # real seconds between a commit and the rescuer seeing it as old enough


class OffsetClock(SystemClock):
    """The wall clock, ``offset`` seconds ahead (the rescuer's accelerated view of time)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)


class InterruptedPass(Exception):
    """Stands for Ctrl-C or a crash in the middle of a rescue pass (after some enqueues)."""


class RecordingQueue:
    """The SQL command queue as the production ``QueueSink`` sees it, remembering which documents
    got a *new* command and when (wall time): a worker's first delivery on a document no retry
    command ever named can only have come through one of these.

    It wraps the sink's *output* (what the sink sends, and the ids the queue accepted as new)
    and nothing else, so the rescuer the checker runs is the production one: ``RescuePass`` over
    the production engine and ``QueueSink``. A broken pass, planner or sink fails the seed
    (``outbox.testing.mutations``); a sink of the checker's own would hide a broken ``QueueSink``.
    """

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.first_command_at: dict[str, float] = {}  # document id -> wall time

    def send(
        self, queue: str, messages: QueueMessage | Sequence[QueueMessage], *, conn: Any = None
    ) -> list[str]:
        batch = [messages] if isinstance(messages, QueueMessage) else list(messages)
        return self._record(batch, lambda: self.queue.send(queue, batch, conn=conn))

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Any = None
    ) -> list[str]:
        batch = [m for _, m in entries]
        return self._record(batch, lambda: self.queue.send_batch(entries, conn=conn))

    def validate(self, queue: str, msg: QueueMessage) -> None:
        self.queue.validate(queue, msg)

    def close(self) -> None:
        self.queue.close()

    def _record(self, batch: list[QueueMessage], send: Callable[[], list[str]]) -> list[str]:
        by_id = {m.message_id: m.session_id for m in batch}
        now = time.time()  # before the send: no worker can have seen the command earlier
        sent = send()
        for message_id in sent:
            doc = by_id.get(message_id)
            if doc is not None:
                self.first_command_at.setdefault(doc, now)
        return sent


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

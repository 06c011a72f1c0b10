"""The rescuer as the checker runs it: the product's ``RescuePass`` and ``QueueSink`` in the
supervisor, on an accelerated clock, the sink's queue recording what it accepted, and the sink
sometimes dying mid-pass.

Time: Delta commit timestamps are real wall time, and the rescuer compares them with its clock's
``now()``. The rescuer here runs on a clock that is ``rescue_delay - COMPRESSED_DELAY`` seconds
ahead of the wall clock, so a commit becomes old enough for the (real, 15 s minimum) delay after
about ``COMPRESSED_DELAY`` real seconds: the pass logic is exactly the product's, only the waiting
is skipped. Reported rescue latencies are real seconds; add the skipped seconds for the
latency a production rescuer with the same delay would show.

The clock also never runs more than ``FIRST_SIGHT`` past the oldest commit no completed pass has
seen (``PassClock``), so every commit is young to the first pass that sees it, whatever the
machine's load: the young tail is exercised on every commit, not only when a pass happens to
start within a second of it.
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
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import OutboxError

log = logging.getLogger("outbox.app.checker")

COMPRESSED_DELAY = 1.0  # real seconds between a commit and the rescuer seeing it as old enough


class OffsetClock(SystemClock):
    """The wall clock, ``offset`` seconds ahead (the rescuer's accelerated view of time)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)


#: During a pass the rescuer's time is at most this many real seconds after the oldest commit no
#: completed pass has seen: less than ``COMPRESSED_DELAY``, so that commit is young to that pass.
FIRST_SIGHT = COMPRESSED_DELAY / 2


class PassClock(OffsetClock):
    """The rescuer's clock in the checker: ``OffsetClock``, but never more than ``FIRST_SIGHT``
    real seconds past the oldest commit of the watched store that no completed pass has seen.

    Why: a pass that mishandles the young tail (the versions past its window's end, such as the
    ``rescue-checkpoint-past-window`` build) only shows it on a commit still young when a pass
    first sees it. On the wall clock alone that needs a pass within ``COMPRESSED_DELAY`` of the
    commit, which a loaded machine does not promise (passes started up to 1.6 s apart at load 13
    in issue 42's runs). Capped so, every commit is young to the first pass that sees it,
    whatever the timing; to later passes it ages as before (the cap follows the newer commits,
    and lifts when every commit was seen): a production rescuer whose pass ran right after them.

    ``watch`` names the store the rescuer refreshes (the pass reads the time after its refresh);
    ``saw`` takes each completed pass's ``latest_version``. ``wall`` is the real clock (a test
    injects a late one).
    """

    def __init__(self, offset: float, *, wall: Clock | None = None) -> None:
        super().__init__(offset)
        self.wall: Clock = wall or SystemClock()
        self.store: Any = None  # outbox.delta.store.DeltaDocumentStore
        self.seen = -1  # the newest version a completed pass saw
        self._times: dict[int, datetime] = {}  # version -> commit time, for versions > seen

    def watch(self, store: Any) -> None:
        self.store = store

    def saw(self, latest: int) -> None:
        self.seen = max(self.seen, latest)
        for version in [v for v in self._times if v <= self.seen]:
            del self._times[version]

    def now(self) -> datetime:
        real = self.wall.now()
        oldest = self._oldest_unseen()
        if oldest is not None:
            real = min(real, oldest + timedelta(seconds=FIRST_SIGHT))
        return real + timedelta(seconds=self.offset)

    def _oldest_unseen(self) -> datetime | None:
        from rescuer.window import commit_times

        if self.store is None:
            return None
        latest = self.store.version()
        if latest <= self.seen:
            return None
        missing = [v for v in range(self.seen + 1, latest + 1) if v not in self._times]
        if missing:  # commits never change: only those committed since the last read
            for c in commit_times(self.store.delta_table, latest - missing[0] + 1, latest=latest):
                self._times[c.version] = c.timestamp
        return min(
            (t for v, t in self._times.items() if self.seen < v <= latest),
            default=None,
        )


class InterruptedPass(Exception):
    """Stands for Ctrl-C or a crash in the middle of a rescue pass (after some enqueues)."""


class RecordingQueue:
    """The SQL command queue as the production ``QueueSink`` sees it, remembering which documents
    got a *new* command and when (wall time): a worker's first delivery on a document no retry
    command ever named can only have come through one of these.

    It wraps the sink's *output* (what the sink sends, and the ids the queue accepted as new)
    and nothing else, so the rescuer the checker runs is the production one: ``RescuePass`` over
    the production engine and ``QueueSink``. A broken pass, planner or sink fails the seed
    (``mutations``); a sink of the checker's own would hide a broken ``QueueSink``.
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


def run_rescue_pass(rescuer: Any, report: CheckReport) -> Any:
    """One rescue pass, accounted for in ``report``; its ``PassReport`` when it completed.

    Only failures the product promises to survive are retried by the next pass (as cron or
    ``--every`` would): the checker's own injected interruption and an ``OutboxError`` (the queue
    is down, the feed is gone). Anything else (a raw driver error that escaped translation, a bug
    in the rescuer) is recorded in ``rescue_errors`` and fails the seed, so it cannot hide behind
    the retries.
    """
    report.rescue_passes += 1
    try:
        return rescuer.run()
    except InterruptedPass:
        report.rescue_passes_interrupted += 1
    except OutboxError as e:
        report.rescue_passes_failed += 1
        log.warning("rescue pass failed (retried next pass): %s", e)
    except Exception as e:
        report.rescue_errors.append(f"{type(e).__name__}: {e}"[:500])
        log.error("rescue pass raised an unexpected %s: %s", type(e).__name__, e, exc_info=True)
    return None

"""Dispatches of concurrent commits combined into one (flat combining), as the store combines
their saves (group commit).

Why: a service with many request threads commits one small unit of work per request. The store
already carries the units that queue during a commit in one Delta append; after it, each thread
dispatched its own one message, so the SQL transport paid one database transaction (one fsync)
per unit, one after the other, and that was the ceiling (benchmarks/small_writers.py: 64 threads,
dispatch calls = units). Here a thread that has committed queues its rows; whichever thread holds
the lead takes everything queued and dispatches it in one call (one coalesced send on a batching
transport, one deferred watermark hand-off), and the others wait until their rows were part of
a finished call. A thread alone leads at once, so one writer pays two uncontended locks.

What stays as it was: ``after_commit`` still returns only after its rows' sends settled (or
failed and were given to a retry command); the rows of every call, and the calls, go in the
order the threads queued (so per-key order across documents is the dispatcher's, as before);
one document committed twice by two threads goes out once, as its newest row (which holds
the older commit's pending messages too; the dispatcher alone would keep whichever came last in
the call, and the threads may queue in either order). A combined call's
latency start is its earliest commit's, so commit-to-settled figures never flatter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from outbox.core.model import DocumentRow

#: ``(rows, started)`` -> nothing: the combined dispatch (the runtime's, which never raises
#: ``Exception``; a ``BaseException`` such as a proof's injected crash passes through).
DispatchAll = Callable[[Sequence[DocumentRow], float], None]


@dataclass(eq=False)
class _Entry:
    rows: Sequence[DocumentRow]
    started: float
    done: bool = False
    error: BaseException | None = field(default=None, repr=False)


class DispatchCombiner:
    """Leader/follower over one queue of committed rows; ``calls`` and ``combined`` count what
    it did (calls made, and calls that carried more than one commit). ``enabled`` False: each
    commit is dispatched on its own thread, alone (what came before; benchmarks/small_writers.py
    measures both)."""

    def __init__(self, dispatch_all: DispatchAll) -> None:
        self._dispatch_all = dispatch_all
        self._queue: list[_Entry] = []
        self._queue_lock = threading.Lock()
        self._lead = threading.Lock()
        self.enabled = True
        self.calls = 0
        self.combined = 0

    def dispatch(self, rows: Sequence[DocumentRow], started: float | None = None) -> None:
        """Dispatch ``rows`` (one commit's), alone or with other threads' queued meanwhile."""
        entry = _Entry(rows, time.perf_counter() if started is None else started)
        if not self.enabled:
            with self._queue_lock:
                self.calls += 1
            self._dispatch_all(rows, entry.started)
            return
        with self._queue_lock:
            self._queue.append(entry)
        while not entry.done:
            with self._lead:
                if entry.done:
                    break
                self._lead_one_call()
        if entry.error is not None:  # the leader died of it (a crash), so does every follower
            raise entry.error

    def _lead_one_call(self) -> None:
        with self._queue_lock:
            taken, self._queue = self._queue, []
        if not taken:
            return
        rows = newest_rows(taken)
        self.calls += 1
        if len(taken) > 1:
            self.combined += 1
        error: BaseException | None = None
        try:
            self._dispatch_all(rows, min(entry.started for entry in taken))
        except BaseException as crash:
            error = crash
            raise
        finally:
            for entry in taken:
                entry.error = error
                entry.done = True


def newest_rows(entries: Sequence[_Entry]) -> list[DocumentRow]:
    """Every entry's rows in queue order, one per document: its newest version (of one life;
    across lives, the one queued last)."""
    newest: dict[str, DocumentRow] = {}
    for e in entries:
        for r in e.rows:
            seen = newest.get(r.id)
            # another life of the id (a foreign delete and create): the later one, as before
            if seen is None or r.incarnation != seen.incarnation or r.version > seen.version:
                newest[r.id] = r
    return list(newest.values())

"""Long actions the console runs in the background: a requeue held to a rate (issue 46, item
3), so 100,000 dead letters go back at, say, 500 a second without swamping a consumer that has
just recovered, while the operator watches its progress on a page that refreshes itself.

Why in this process's memory and not a table: a job is the console's own work (a thread), and
what it did is safe to cut short: each chunk moves its dead letters in one transaction, so a
console stopped midway leaves the rest dead-lettered, where they were, and the audit trail says
how many went. The job's page says so."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from outbox.core.clock import Clock, utc

log = logging.getLogger("outbox.console")

#: Jobs remembered (the oldest finished ones are forgotten first).
KEPT = 100


@dataclass
class Job:
    id: int
    label: str
    actor: str
    total: int
    rate: float | None
    started_at: datetime
    done: int = 0
    state: str = "running"  # running, done, failed
    error: str | None = None
    finished_at: datetime | None = None
    thread: threading.Thread | None = field(default=None, repr=False, compare=False)


#: The work: called with a progress callback (items done in a step), returns how many it did.
Work = Callable[[Callable[[int], None]], int]


class Jobs:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)

    def start(
        self,
        label: str,
        *,
        actor: str,
        total: int,
        rate: float | None,
        work: Work,
        finished: Callable[[Job], None],
    ) -> Job:
        """Run ``work`` on a thread of its own; ``finished(job)`` is called when it ends,
        whatever the outcome (the audit record)."""
        job = Job(next(self._ids), label, actor, total, rate, utc(self._clock.now()))

        def progress(n: int) -> None:
            job.done += n

        def run() -> None:
            try:
                job.done = work(progress)
                job.state = "done"
            except Exception as e:  # shown on the job's page and recorded
                log.exception("console: job %d (%s) failed", job.id, label)
                job.state, job.error = "failed", str(e)
            finally:
                job.finished_at = utc(self._clock.now())
                finished(job)

        with self._lock:
            self._jobs[job.id] = job
            while len(self._jobs) > KEPT:
                oldest = next((j for j in self._jobs.values() if j.state != "running"), None)
                if oldest is None:
                    break
                del self._jobs[oldest.id]
        job.thread = threading.Thread(target=run, name=f"console-job-{job.id}", daemon=True)
        job.thread.start()
        return job

    def get(self, job_id: int) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.id, reverse=True)

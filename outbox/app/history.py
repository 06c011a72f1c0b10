"""The console's history: numbers sampled over time, kept in the workspace's own database.

Why here and not in Prometheus: an operator who opens ``outbox console`` should see how the
rescue lag moved over the last hours without running anything else. The processes that already
run record the samples (``outbox.app.sampling``); this module stores and reads them.

One row per metric, subject (a rescuer's name; ``""`` for the table as a whole) and slot. The
row's time is its slot's start (``taken_at`` rounded down to the sampling interval), so two
processes sampling in the same slot write one row: the first wins, the second changes nothing.
Rows older than the retention are deleted as new ones are written, a bounded number at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from dispatcher.queue.database import Database
from migrations.sql.tables import samples as T
from outbox.core.clock import utc

#: The metrics the console charts or shows (subject in brackets):
PENDING_DOCUMENTS = "pending_documents"  # ("")
PENDING_MESSAGES = "pending_messages"  # ("")
OLDEST_PENDING_AGE = "oldest_pending_age_seconds"  # (""), absent when nothing is pending
RESCUE_LAG_SECONDS = "rescue_lag_seconds"  # (rescuer name)
RESCUE_LAG_VERSIONS = "rescue_lag_versions"  # (rescuer name)
GEO_CLAIMS_IN_FLIGHT = "geo_claims_in_flight"  # ("")

#: How many old rows one write deletes at most: a write stays short however long sampling was
#: off before (the rest go with the next writes).
PRUNE_BATCH = 5_000


@dataclass(frozen=True)
class Sample:
    metric: str
    subject: str
    value: float


@dataclass(frozen=True)
class Point:
    at: datetime
    value: float


def slot_start(at: datetime, interval: float) -> datetime:
    """The start of the sampling slot ``at`` falls in (UTC)."""
    ts = utc(at).timestamp()
    step = max(1.0, float(interval))
    return datetime.fromtimestamp(ts - ts % step, tz=UTC)


class History:
    """Samples in the queue's database (the ``outbox_samples`` table, migration 0006)."""

    def __init__(self, db: Database, *, retention: timedelta = timedelta(days=7)) -> None:
        self._db = db
        self._retention = retention

    def record(
        self, samples: Iterable[Sample], *, at: datetime, interval: float, source: str
    ) -> int:
        """Write ``samples`` in the slot of ``at``; returns how many rows were new (a slot another
        process sampled first keeps its values). Old rows beyond the retention are pruned."""
        taken = slot_start(at, interval)
        rows = [
            {
                "metric": s.metric,
                "subject": s.subject,
                "taken_at": taken,
                "value": float(s.value),
                "source": source[:260],
            }
            for s in samples
        ]
        if not rows:
            return 0
        dialect = postgresql if self._db.postgres else sqlite
        stmt = dialect.insert(T).on_conflict_do_nothing(
            index_elements=["metric", "subject", "taken_at"]
        )
        with self._db.write("record console samples") as conn:
            added = int(conn.execute(stmt, rows).rowcount or 0)
            cutoff = utc(at) - self._retention
            old = select(T.c.taken_at).where(T.c.taken_at < cutoff).limit(PRUNE_BATCH)
            oldest = conn.execute(select(func.max(old.subquery().c.taken_at))).scalar()
            if oldest is not None:
                conn.execute(delete(T).where(T.c.taken_at <= oldest))
        return max(0, added)

    def latest(self, metrics: Sequence[str]) -> dict[tuple[str, str], Point]:
        """The newest value of each (metric, subject) of ``metrics``."""
        newest = (
            select(T.c.metric, T.c.subject, func.max(T.c.taken_at).label("taken_at"))
            .where(T.c.metric.in_(list(metrics)))
            .group_by(T.c.metric, T.c.subject)
            .subquery()
        )
        stmt = select(T.c.metric, T.c.subject, T.c.taken_at, T.c.value).join(
            newest,
            (T.c.metric == newest.c.metric)
            & (T.c.subject == newest.c.subject)
            & (T.c.taken_at == newest.c.taken_at),
        )
        with self._db.read("read console samples") as conn:
            return {
                (r.metric, r.subject): Point(utc(r.taken_at), float(r.value))
                for r in conn.execute(stmt)
            }

    def series(
        self, metric: str, *, since: datetime, max_points: int = 300
    ) -> dict[str, list[Point]]:
        """Each subject's values of ``metric`` since ``since``, oldest first, thinned to at most
        ``max_points`` per subject (the largest value of each run of points is kept: a chart of a
        lag must not hide a spike)."""
        stmt = (
            select(T.c.subject, T.c.taken_at, T.c.value)
            .where(T.c.metric == metric, T.c.taken_at >= utc(since))
            .order_by(T.c.subject, T.c.taken_at)
        )
        out: dict[str, list[Point]] = {}
        with self._db.read("read console samples") as conn:
            for r in conn.execute(stmt):
                out.setdefault(r.subject, []).append(Point(utc(r.taken_at), float(r.value)))
        return {k: thin(v, max_points) for k, v in out.items()}


def thin(points: list[Point], max_points: int) -> list[Point]:
    """At most ``max_points`` points: runs of consecutive points become their largest one."""
    if len(points) <= max_points or max_points < 1:
        return points
    size = -(-len(points) // max_points)
    return [max(points[i : i + size], key=lambda p: p.value) for i in range(0, len(points), size)]

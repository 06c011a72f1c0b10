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
DEAD_LETTERS = "dead_letters"  # (queue name): dead letters held for it

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
        taken = _seconds(slot_start(at, interval))
        rows = [
            {
                "metric": s.metric,
                "subject": s.subject,
                "taken_at_s": taken,
                "value": float(s.value),
                "source": source[:260],
            }
            for s in samples
        ]
        if not rows:
            return 0
        dialect = postgresql if self._db.postgres else sqlite
        stmt = dialect.insert(T).on_conflict_do_nothing(
            index_elements=["metric", "subject", "taken_at_s"]
        )
        with self._db.write("record console samples") as conn:
            added = int(conn.execute(stmt, rows).rowcount or 0)
            cutoff = _seconds(utc(at) - self._retention)
            old = select(T.c.taken_at_s).where(T.c.taken_at_s < cutoff).limit(PRUNE_BATCH)
            oldest = conn.execute(select(func.max(old.subquery().c.taken_at_s))).scalar()
            if oldest is not None:
                conn.execute(delete(T).where(T.c.taken_at_s <= oldest))
        return max(0, added)

    def latest(
        self, metrics: Sequence[str], *, now: datetime | None = None
    ) -> dict[tuple[str, str], Point]:
        """The newest value of each (metric, subject) of ``metrics``.

        Read from the last ``RECENT`` before ``now`` first (a few rows per series through the
        range index, while processes sample); only when nothing was sampled then does it look
        through the whole history."""
        if now is not None:
            found = self._latest(metrics, since=_seconds(utc(now) - RECENT))
            if found:
                return found
        return self._latest(metrics, since=None)

    def _latest(self, metrics: Sequence[str], *, since: int | None) -> dict[tuple[str, str], Point]:
        newest = select(T.c.metric, T.c.subject, func.max(T.c.taken_at_s).label("at")).where(
            T.c.metric.in_(list(metrics))
        )
        if since is not None:
            newest = newest.where(T.c.taken_at_s >= since)
        last = newest.group_by(T.c.metric, T.c.subject).subquery()
        stmt = select(T.c.metric, T.c.subject, T.c.taken_at_s, T.c.value).join(
            last,
            (T.c.metric == last.c.metric)
            & (T.c.subject == last.c.subject)
            & (T.c.taken_at_s == last.c.at),
        )
        with self._db.read("read console samples") as conn:
            return {
                (r.metric, r.subject): Point(_time(r.taken_at_s), float(r.value))
                for r in conn.execute(stmt)
            }

    def series(
        self, metric: str, *, since: datetime, until: datetime | None = None, max_points: int = 300
    ) -> dict[str, list[Point]]:
        """Each subject's values of ``metric`` from ``since`` (to ``until``), oldest first, at
        most ``max_points`` per subject: the range is cut into that many buckets and each keeps
        its largest value (a chart of a lag must not hide a spike). The buckets are made by the
        database, so a week of samples every minute leaves it as 300 rows per subject."""
        start = _seconds(since)
        end = _seconds(until) if until is not None else None
        span = max(1, (end if end is not None else _seconds(utc(datetime.now(UTC)))) - start)
        width = max(1, -(-span // max(1, max_points)))
        bucket = (T.c.taken_at_s - start) // width
        stmt = (
            select(
                T.c.subject,
                func.max(T.c.taken_at_s).label("at"),
                func.max(T.c.value).label("value"),
            )
            .where(T.c.metric == metric, T.c.taken_at_s >= start)
            .group_by(T.c.subject, bucket)
            .order_by(T.c.subject, func.max(T.c.taken_at_s))
        )
        if end is not None:
            stmt = stmt.where(T.c.taken_at_s <= end)
        out: dict[str, list[Point]] = {}
        with self._db.read("read console samples") as conn:
            for r in conn.execute(stmt):
                out.setdefault(r.subject, []).append(Point(_time(r.at), float(r.value)))
        return out


#: How far back ``latest`` looks first.
RECENT = timedelta(hours=1)


def _seconds(at: datetime) -> int:
    return int(utc(at).timestamp())


def _time(seconds: int) -> datetime:
    return datetime.fromtimestamp(int(seconds), tz=UTC)

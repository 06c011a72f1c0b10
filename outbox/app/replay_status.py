"""What the replays of a workspace are at: ``outbox replay --status``, ``outbox status``'s
section, and the versions the unfinished ones hold from the log trim
(``outbox.app.rescuer_history``). Read-only; ``outbox.app.replay`` writes the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, inspect, select

from migrations.sql.tables import replay_chunks, replays
from outbox.core.clock import Clock, utc
from outbox.core.errors import OutboxError

if TYPE_CHECKING:
    from dispatcher.queue.database import Database
    from outbox.core.settings import Settings

#: ``replay_retention``'s default, for a caller without settings: how long an unfinished replay
#: holds the log trim (a replay abandoned half-way must not keep every commit for ever) and how
#: long ``outbox maintain`` keeps a finished one.
DEFAULT_REPLAY_RETENTION = 30 * 24 * 3600.0


@dataclass
class ReplayStatus:
    """One replay as ``outbox replay --status`` and ``outbox status`` show it."""

    replay_id: str
    from_version: int
    to_version: int
    status: str
    messages: int | None
    chunks: int | None
    enqueued_chunks: int
    sent_chunks: int
    sent_messages: int
    new_ids: bool
    predicate: str | None
    destination: str | None
    created_at: datetime
    finished_at: datetime | None
    by_destination_type: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def replay_retention(settings: Settings | None) -> float:
    """``replay_retention`` in seconds (0: an unfinished replay holds the trim until done)."""
    return DEFAULT_REPLAY_RETENTION if settings is None else float(settings.replay_retention)


def finished_replays(db: Database) -> tuple[int, datetime | None]:
    """The finished replays kept (``outbox status``'s retention row): how many, and when the
    oldest finished."""
    with db.read("count the finished replays") as c:
        rows, oldest = c.execute(
            select(func.count(), func.min(replays.c.finished_at)).where(replays.c.status == "done")
        ).one()
    return int(rows), oldest


def statuses(db: Database, *, replay_id: str | None = None) -> list[ReplayStatus]:
    """Every replay (or one), newest first, with its chunks sent."""
    sent = (
        select(
            replay_chunks.c.replay_id,
            func.count().label("n"),
            func.sum(replay_chunks.c.messages).label("m"),
        )
        .group_by(replay_chunks.c.replay_id)
        .subquery()
    )
    query = select(replays, sent.c.n, sent.c.m).outerjoin(
        sent, sent.c.replay_id == replays.c.replay_id
    )
    if replay_id is not None:
        query = query.where(replays.c.replay_id == replay_id)
    with db.read("read the replays") as c:
        rows = c.execute(query.order_by(replays.c.created_at.desc())).all()
    return [_status(r) for r in rows]


def _status(r: Any) -> ReplayStatus:
    details = json.loads(r.details) if r.details else {}
    return ReplayStatus(
        replay_id=r.replay_id,
        from_version=int(r.from_version),
        to_version=int(r.to_version),
        status=r.status,
        messages=r.messages,
        chunks=r.chunks,
        enqueued_chunks=int(r.enqueued),
        sent_chunks=int(r.n or 0),
        sent_messages=int(r.m or 0),
        new_ids=bool(r.new_ids),
        predicate=r.predicate,
        destination=r.destination,
        created_at=utc(r.created_at),
        finished_at=utc(r.finished_at) if r.finished_at else None,
        by_destination_type=list(details.get("by_destination_type", [])),
    )


def holding_versions(
    engine: Any, table_uri: str, table_id: str | None, now: datetime, retention: float
) -> list[int]:
    """The oldest version each unfinished replay of the table still reads (the version before
    its range: the planner reads the table as of it), for the log trim's holder list. A replay
    older than ``retention`` no longer holds (``retention`` 0: every unfinished one holds).
    Nothing when the database predates replays."""
    with engine.connect() as c:
        if not inspect(c).has_table(replays.name):
            return []
        where = replays.c.table_uri == table_uri
        if table_id is not None:
            where = where | (replays.c.table_id == table_id)
        query = select(replays.c.from_version).where(where, replays.c.status != "done")
        if retention > 0:
            query = query.where(replays.c.created_at >= now - timedelta(seconds=retention))
        rows = c.execute(query).all()
    return [max(0, int(r.from_version) - 1) for r in rows]


def status_section(report: Any, settings: Settings, clock: Clock) -> None:
    """``outbox status``'s replays: the unfinished ones, and those finished in the last day; a
    problem line when they cannot be read (none when the queues' line already says that the
    database cannot be read)."""
    from outbox.wiring import Backends

    if any(p.startswith("queues:") for p in report.problems):
        return  # the same database: the queues' problem line already says it cannot be read
    try:
        with Backends(settings, clock=clock) as backends:
            db = backends.sql_queue.database
            with db.read("check for replays") as c:
                if not inspect(c).has_table(replays.name):
                    return
            since = clock.now() - timedelta(days=1)
            report.replays = [
                s
                for s in statuses(db)
                if s.status != "done" or (s.finished_at is not None and s.finished_at >= since)
            ]
    except OutboxError as e:
        report.problems.append(f"replays: {e}")

"""Browsing the dead letters a page at a time: the console's list, filters and selections.

Why apart from the administration: these reads page by id (newest first, the next page starts
below the last id shown), so a page costs the same at the first and the thousandth page of
100,000 dead letters; they leave the bodies out of lists; and they filter by time, which the
administration's equality filters (``--where key=value``) do not. The indexes they use are
migration 0006's (reason, time, device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, func, literal, select, tuple_

from dispatcher.queue.database import Database
from dispatcher.queue.messages import DeadLetter
from dispatcher.queue.rows import dead_letter
from migrations.sql.tables import dead_letters as D


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: each field that is set narrows the selection. ``up_to_id`` freezes a
    selection ("all 1,234 matching") at what was shown, so dead letters that arrive between the
    confirmation and the action are not swept along."""

    queue: str | None = None
    reason: str | None = None
    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    up_to_id: int | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if self.queue:
            out.append(D.c.queue == self.queue)
        if self.reason:
            out.append(D.c.reason == self.reason)
        if self.session_id:
            out.append(D.c.session_id == self.session_id)
        if self.since is not None:
            out.append(D.c.dead_lettered_at >= self.since)
        if self.until is not None:
            out.append(D.c.dead_lettered_at < self.until)
        if self.up_to_id is not None:
            out.append(D.c.id <= self.up_to_id)
        return out


#: Every column but the body, which a list never shows (a body can be 256 KiB).
_LISTED = [c for c in D.c if c.name != "body"]


class DeadLetterBrowser:
    """Paged reads of one ``SqlQueue``'s dead letters (thread safe, like the queue)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def page(
        self, selection: DeadLetterFilter, *, before_id: int | None = None, limit: int = 50
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, newest first, after ``before_id`` in that order; bodies
        left empty.

        Newest first is by id, or by time and then id when the selection has a time window: the
        time index then serves the order too, so a month-wide window is read 50 rows at a time
        instead of sorted whole (ids and times agree except across processes' clocks)."""
        conditions = selection.conditions()
        by_time = selection.since is not None or selection.until is not None
        with self._db.read("list dead letters") as conn:
            if before_id is not None:
                conditions.append(_below(conn, before_id, by_time=by_time))
            order = [D.c.dead_lettered_at.desc(), D.c.id.desc()] if by_time else [D.c.id.desc()]
            stmt = (
                select(*_LISTED, literal(b"").label("body"))
                .where(*conditions)
                .order_by(*order)
                .limit(limit)
            )
            return [dead_letter(r) for r in conn.execute(stmt).mappings()]

    def count(self, selection: DeadLetterFilter) -> int:
        stmt = select(func.count()).select_from(D).where(*selection.conditions())
        with self._db.read("count dead letters") as conn:
            return int(conn.execute(stmt).scalar_one())

    def newest_id(self, selection: DeadLetterFilter) -> int | None:
        """The highest id the selection holds now (None: it is empty)."""
        stmt = select(func.max(D.c.id)).where(*selection.conditions())
        with self._db.read("read dead letters") as conn:
            found = conn.execute(stmt).scalar()
        return None if found is None else int(found)

    def existing(self, ids: Sequence[int]) -> list[int]:
        """Which of ``ids`` are still dead letters (another operator may have acted first)."""
        if not ids:
            return []
        with self._db.read("read dead letters") as conn:
            found = conn.execute(select(D.c.id).where(D.c.id.in_(list(ids)))).scalars()
            return sorted(int(i) for i in found)

    def reasons(self, queue: str | None = None) -> list[str]:
        """The distinct reasons (of ``queue``'s dead letters when given), sorted."""
        stmt = select(D.c.reason).distinct().order_by(D.c.reason)
        if queue:
            stmt = stmt.where(D.c.queue == queue)
        with self._db.read("read dead-letter reasons") as conn:
            return [str(r) for r in conn.execute(stmt).scalars()]

    def counts(self) -> dict[tuple[str, str], int]:
        """How many dead letters each (queue, reason) holds: one grouped count over the
        (queue, reason, id) index."""
        stmt = select(D.c.queue, D.c.reason, func.count()).group_by(D.c.queue, D.c.reason)
        with self._db.read("count dead letters per queue and reason") as conn:
            return {(str(q), str(r)): int(n) for q, r, n in conn.execute(stmt)}

    def queues(self) -> list[str]:
        """The queues that hold dead letters, sorted."""
        stmt = select(D.c.queue).distinct().order_by(D.c.queue)
        with self._db.read("read dead-letter queues") as conn:
            return [str(r) for r in conn.execute(stmt).scalars()]


def _below(conn: Connection, before_id: int, *, by_time: bool) -> ColumnElement[bool]:
    """What comes after dead letter ``before_id`` in a list's order (by id, or by time and id;
    by id alone when that dead letter is gone)."""
    if by_time:
        at = conn.execute(select(D.c.dead_lettered_at).where(D.c.id == before_id)).scalar()
        if at is not None:
            return tuple_(D.c.dead_lettered_at, D.c.id) < tuple_(
                literal(at, D.c.dead_lettered_at.type), literal(before_id)
            )
    return D.c.id < before_id

"""The queue's administration: depths (stats), dead letters (list, show, count, requeue, purge, by
ids, by filter, by a console ``DeadLetterFilter`` or all) and housekeeping (pruning expired
duplicate-detection ids, and dead letters older than ``dead_letter_retention``).

Requeue and purge work in chunks of ``CHUNK`` rows, one short transaction each, so a large purge
never holds SQLite's write lock for long and can report progress. Pruning is bounded the same way
(``DEDUP_CLEANUP_LIMIT`` ids per run) and runs at most every half window from the sender's
after-commit hook, or from ``outbox maintain`` and an idle worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    and_,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    true,
    tuple_,
)

from dispatcher.queue import validation
from dispatcher.queue.browse import DeadLetterFilter
from dispatcher.queue.database import Database
from dispatcher.queue.messages import DeadLetter, QueueStats
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.ports import DEDUP_CLEANUP_LIMIT
from dispatcher.queue.rows import COPIED_COLUMNS, dead_letter, lock_sessions
from dispatcher.queue.selection import FILTER_KEYS, DeadLetterSelection, check_where
from migrations.sql.tables import dead_letters, duplicate_ids, queue_messages
from outbox.core.errors import MessageNotFoundError, OutboxError

log = logging.getLogger("outbox.queue")

M = queue_messages
D = dead_letters
CHUNK = 500
__all__ = ["CHUNK", "FILTER_KEYS", "SqlQueueAdministration"]


class SqlQueueAdministration:
    """The ``QueueAdministration`` of one ``SqlQueue`` (thread safe, like the queue)."""

    def __init__(self, db: Database, options: QueueOptions) -> None:
        self._db = db
        self._options = options
        self._last_clean: datetime | None = None  # None: clean at the first chance
        self._clean_guard = threading.Lock()

    # --- depths ----------------------------------------------------------------------------

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """See ``QueueAdministration.stats``."""
        if queue is not None:
            validation.queue_name(queue)
        now = self._options.now()
        is_locked = and_(M.c.locked_until.is_not(None), M.c.locked_until > now)
        is_deferred = and_(~is_locked, M.c.deferred)
        is_scheduled = and_(~is_locked, ~M.c.deferred, M.c.not_before > now)
        live_stmt = select(
            M.c.queue,
            func.count().label("total"),
            func.sum(case((is_locked, 1), else_=0)).label("locked"),
            func.sum(case((is_scheduled, 1), else_=0)).label("scheduled"),
            func.sum(case((is_deferred, 1), else_=0)).label("deferred"),
        ).group_by(M.c.queue)
        dead_stmt = select(D.c.queue, func.count()).group_by(D.c.queue)
        if queue is not None:
            live_stmt = live_stmt.where(M.c.queue == queue)
            dead_stmt = dead_stmt.where(D.c.queue == queue)
        with self._db.read("read queue stats") as conn:
            live = conn.execute(live_stmt).all()
            dead = conn.execute(dead_stmt).all()
        out: dict[str, QueueStats] = {}
        for name, total, locked_raw, scheduled_raw, deferred_raw in live:
            locked, scheduled = int(locked_raw or 0), int(scheduled_raw or 0)
            deferred = int(deferred_raw or 0)
            out[name] = QueueStats(
                name,
                active=int(total) - locked - scheduled - deferred,
                scheduled=scheduled,
                locked=locked,
                deferred=deferred,
            )
        for name, count in dead:
            base = out.get(name, QueueStats(name))
            out[name] = QueueStats(
                name,
                base.active,
                base.scheduled,
                base.locked,
                dead_lettered=int(count),
                deferred=base.deferred,
            )
        return dict(sorted(out.items()))

    # --- dead letters ----------------------------------------------------------------------

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        """See ``QueueAdministration.list_dead_letters``."""
        validation.positive("limit", limit)
        conditions = _filter(where)
        if queue is not None:
            conditions.append(D.c.queue == validation.queue_name(queue))
        with self._db.read("list dead letters") as conn:
            stmt = select(D).where(*conditions).order_by(D.c.id).limit(limit)
            return [dead_letter(r) for r in conn.execute(stmt).mappings()]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        """See ``QueueAdministration.get_dead_letter``."""
        validation.positive("dead letter id", dead_letter_id)
        with self._db.read("read a dead letter") as conn:
            row = conn.execute(select(D).where(D.c.id == dead_letter_id)).mappings().first()
        if row is None:
            raise MessageNotFoundError(
                f"no dead letter has id {dead_letter_id}",
                hint="list them with `outbox dead-letters list`",
            )
        return dead_letter(row)

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        """See ``QueueAdministration.count_dead_letters``."""
        conditions = _conditions(DeadLetterSelection.of(ids, where=where, all=all))
        with self._db.read("count dead letters") as conn:
            stmt = select(func.count()).select_from(D).where(*conditions)
            return int(conn.execute(stmt).scalar_one())

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
        to_queue: str | None = None,
        chunk: int | None = None,
    ) -> int:
        """See ``QueueAdministration.requeue``. ``to_queue``: into that queue instead of each
        one's own; ``chunk``: dead letters per transaction (a paced requeue's step)."""
        return self._requeue(
            _conditions(DeadLetterSelection.of(ids, where=where, all=all)),
            on_progress,
            to_queue,
            chunk,
        )

    def requeue_matching(
        self,
        selection: DeadLetterFilter,
        *,
        on_progress: Callable[[int], None] | None = None,
        to_queue: str | None = None,
        chunk: int | None = None,
    ) -> int:
        """Requeue what ``selection`` holds: the console's filters, a time window included,
        which the equality filters of ``requeue(where=...)`` cannot say. No filter: all."""
        return self._requeue(selection.conditions(), on_progress, to_queue, chunk)

    def _requeue(
        self,
        conditions: list[ColumnElement[bool]],
        on_progress: Callable[[int], None] | None,
        to_queue: str | None = None,
        chunk: int | None = None,
    ) -> int:
        now = self._options.now()
        postgres = self._db.postgres
        if to_queue is not None:
            validation.queue_name(to_queue)

        def move_back(conn: Connection, chunk: list[int]) -> None:
            if postgres:
                keys = conn.execute(select(D.c.queue, D.c.session_id).where(D.c.id.in_(chunk)))
                lock_sessions(conn, [(to_queue or q, s) for q, s in keys])
            names = list(COPIED_COLUMNS)
            copied = [
                _name_const(to_queue).label("queue") if n == "queue" and to_queue else D.c[n]
                for n in names
            ]
            source = (
                select(*copied)
                .add_columns(_const(now).label("not_before"), _zero().label("delivery_count"))
                .where(D.c.id.in_(chunk))
                .order_by(D.c.sequence_number, D.c.id)  # keep each session's original order
            )
            conn.execute(insert(M).from_select([*names, "not_before", "delivery_count"], source))

        return self._chunks("requeue dead letters", conditions, move_back, on_progress, chunk)

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """See ``QueueAdministration.purge``."""
        return self._purge(
            _conditions(DeadLetterSelection.of(ids, where=where, all=all)), on_progress
        )

    def purge_matching(
        self, selection: DeadLetterFilter, *, on_progress: Callable[[int], None] | None = None
    ) -> int:
        """Purge what ``selection`` holds (see ``requeue_matching``)."""
        return self._purge(selection.conditions(), on_progress)

    def _purge(
        self, conditions: list[ColumnElement[bool]], on_progress: Callable[[int], None] | None
    ) -> int:
        return self._chunks("purge dead letters", conditions, lambda _c, _i: None, on_progress)

    def _chunks(
        self,
        action: str,
        conditions: list[ColumnElement[bool]],
        work: Callable[[Connection, list[int]], None],
        on_progress: Callable[[int], None] | None,
        chunk: int | None = None,
    ) -> int:
        """Apply ``work`` then delete, ``chunk`` (``CHUNK``) dead letters per transaction, in id
        order."""
        limit = min(CHUNK, max(1, chunk)) if chunk else CHUNK
        done = 0
        last_id = 0
        while True:
            with self._db.write(action) as conn:
                stmt = (
                    select(D.c.id)
                    .where(*conditions, D.c.id > last_id)
                    .order_by(D.c.id)
                    .limit(limit)
                )
                if self._db.postgres:
                    stmt = stmt.with_for_update(skip_locked=True)
                ids = [int(i) for i in conn.execute(stmt).scalars()]
                if not ids:
                    return done
                work(conn, ids)
                conn.execute(delete(D).where(D.c.id.in_(ids)))
            done += len(ids)
            last_id = ids[-1]
            if on_progress is not None:
                on_progress(len(ids))

    # --- housekeeping ----------------------------------------------------------------------

    def prune_dead_letters(self, before: datetime) -> int:
        """Delete the dead letters of every queue dead-lettered before ``before``
        (``dead_letter_retention``, from ``outbox maintain``); returns how many. In ``CHUNK``s,
        one short transaction each, skipping rows an operator's requeue holds (PostgreSQL)."""
        return self._purge([D.c.dead_lettered_at < before], None)

    def oldest_dead_letter(self) -> tuple[int, datetime | None]:
        """How many dead letters there are, and when the oldest was dead-lettered."""
        with self._db.read("count dead letters") as conn:
            n, oldest = conn.execute(select(func.count(), func.min(D.c.dead_lettered_at))).one()
        return int(n), oldest

    def forget_expired_duplicates(self, limit: int | None = DEDUP_CLEANUP_LIMIT) -> int:
        """Delete up to ``limit`` (None: all) duplicate-detection ids older than the window;
        returns how many. Sends call it through ``maybe_forget_expired_duplicates`` at most every
        half window; ``outbox maintain`` or an idle worker may call either."""
        with self._db.write("clean duplicate-detection ids") as conn:
            cutoff = self._options.now() - self._options.duplicate_detection_window
            expired = duplicate_ids.c.seen_at <= cutoff
            if limit is None:
                stmt = delete(duplicate_ids).where(expired)
            else:
                validation.positive("limit", limit)
                oldest = (
                    select(duplicate_ids.c.queue, duplicate_ids.c.message_id)
                    .where(expired)
                    .order_by(duplicate_ids.c.seen_at)
                    .limit(limit)
                )
                stmt = delete(duplicate_ids).where(
                    tuple_(duplicate_ids.c.queue, duplicate_ids.c.message_id).in_(oldest)
                )
            result = conn.execute(stmt)
        return int(result.rowcount)

    def maybe_forget_expired_duplicates(self) -> int:
        """``forget_expired_duplicates()`` when half a window has passed since the last cleanup
        by this instance (or it never ran). Never raises: a failed cleanup is logged and tried
        again next time. Returns how many ids were deleted."""
        now = self._options.now()
        half_window = self._options.duplicate_detection_window / 2
        due = self._last_clean is None or now - self._last_clean > half_window
        if not due or not self._clean_guard.acquire(blocking=False):
            return 0
        try:
            deleted = self.forget_expired_duplicates()
        except OutboxError as e:
            log.warning("cleaning expired duplicate-detection ids failed (retried later): %s", e)
            return 0
        finally:
            self._clean_guard.release()
        self._last_clean = now
        return deleted

    def close(self) -> None:
        """Close the queue this administration belongs to (its parts share one connection pool)."""
        self._db.close()


def _filter(where: Mapping[str, str] | None) -> list[ColumnElement[bool]]:
    check_where(where)
    return [D.c[key] == value for key, value in (where or {}).items()]


def _conditions(selection: DeadLetterSelection) -> list[ColumnElement[bool]]:
    """``selection`` as the dead-letter table's conditions."""
    if selection.ids is not None:
        return [D.c.id.in_(selection.ids)]
    if selection.all:
        return [true()]
    return _filter(selection.where)


def _const(now: datetime) -> ColumnElement[datetime]:
    return literal(now, DateTime(timezone=True))


def _zero() -> ColumnElement[int]:
    return literal(0, Integer())


def _name_const(name: str) -> ColumnElement[str]:
    return literal(name, D.c.queue.type)

"""Dead-letter administration: list, show, requeue and purge, by ids, by filter or all.

Requeue and purge work in chunks of ``CHUNK`` rows, one short transaction each, so a large purge
never holds SQLite's write lock for long and can report progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    delete,
    func,
    insert,
    literal,
    select,
    true,
)

from dispatcher.queue import validation
from dispatcher.queue.database import Database
from dispatcher.queue.messages import DeadLetter
from dispatcher.queue.rows import COPIED_COLUMNS, dead_letter, lock_sessions
from migrations.sql.tables import dead_letters, queue_messages
from outbox.core.errors import MessageNotFoundError, ValidationError

D = dead_letters
CHUNK = 500
FILTER_KEYS = ("queue", "reason", "session_id", "message_id", "subject")


def _filter(where: Mapping[str, str] | None) -> list[ColumnElement[bool]]:
    out: list[ColumnElement[bool]] = []
    for key, value in (where or {}).items():
        if key not in FILTER_KEYS:
            raise ValidationError(
                f"cannot filter dead letters by {key!r}",
                hint=f"use one of {', '.join(FILTER_KEYS)}",
            )
        out.append(D.c[key] == value)
    return out


def _selection(
    ids: Sequence[int] | None, where: Mapping[str, str] | None, everything: bool
) -> list[ColumnElement[bool]]:
    given = sum([ids is not None, bool(where), everything])
    if given != 1:
        raise ValidationError(
            "say which dead letters: ids, a where filter, or all (exactly one)",
            hint="e.g. requeue 12 13, requeue --where reason=Timeout, or requeue --all",
        )
    if ids is not None:
        checked = [validation.positive("dead letter id", i) for i in ids]
        return [D.c.id.in_(checked)]
    if everything:
        return [true()]
    return _filter(where)


def list_(
    db: Database, queue: str | None, limit: int, where: Mapping[str, str] | None
) -> list[DeadLetter]:
    validation.positive("limit", limit)
    conditions = _filter(where)
    if queue is not None:
        conditions.append(D.c.queue == validation.queue_name(queue))
    with db.read("list dead letters") as conn:
        rows = conn.execute(select(D).where(*conditions).order_by(D.c.id).limit(limit)).mappings()
        return [dead_letter(r) for r in rows]


def get(db: Database, dead_letter_id: int) -> DeadLetter:
    validation.positive("dead letter id", dead_letter_id)
    with db.read("read a dead letter") as conn:
        row = conn.execute(select(D).where(D.c.id == dead_letter_id)).mappings().first()
    if row is None:
        raise MessageNotFoundError(
            f"no dead letter has id {dead_letter_id}",
            hint="list them with `outbox dead-letters list`",
        )
    return dead_letter(row)


def count(
    db: Database, ids: Sequence[int] | None, where: Mapping[str, str] | None, everything: bool
) -> int:
    conditions = _selection(ids, where, everything)
    with db.read("count dead letters") as conn:
        return int(
            conn.execute(select(func.count()).select_from(D).where(*conditions)).scalar_one()
        )


def _chunks(
    db: Database,
    action: str,
    conditions: list[ColumnElement[bool]],
    work: Callable[[Connection, list[int]], None],
    on_progress: Callable[[int], None] | None,
) -> int:
    done = 0
    last_id = 0
    while True:
        with db.write(action) as conn:
            stmt = select(D.c.id).where(*conditions, D.c.id > last_id).order_by(D.c.id).limit(CHUNK)
            if db.postgres:
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


def requeue(
    db: Database,
    now: datetime,
    *,
    ids: Sequence[int] | None,
    where: Mapping[str, str] | None,
    everything: bool,
    on_progress: Callable[[int], None] | None,
) -> int:
    conditions = _selection(ids, where, everything)

    def move_back(conn: Connection, chunk: list[int]) -> None:
        if db.postgres:
            keys = conn.execute(select(D.c.queue, D.c.session_id).where(D.c.id.in_(chunk)))
            lock_sessions(conn, [(q, s) for q, s in keys])
        names = list(COPIED_COLUMNS)
        source = (
            select(*(D.c[n] for n in names))
            .add_columns(_const(now).label("not_before"), _zero().label("delivery_count"))
            .where(D.c.id.in_(chunk))
            .order_by(D.c.sequence_number, D.c.id)  # keep each session's original order
        )
        conn.execute(
            insert(queue_messages).from_select([*names, "not_before", "delivery_count"], source)
        )

    return _chunks(db, "requeue dead letters", conditions, move_back, on_progress)


def purge(
    db: Database,
    ids: Sequence[int] | None,
    where: Mapping[str, str] | None,
    everything: bool,
    on_progress: Callable[[int], None] | None,
) -> int:
    conditions = _selection(ids, where, everything)
    return _chunks(db, "purge dead letters", conditions, lambda _c, _i: None, on_progress)


def _const(now: datetime) -> ColumnElement[datetime]:
    return literal(now, DateTime(timezone=True))


def _zero() -> ColumnElement[int]:
    return literal(0, Integer())

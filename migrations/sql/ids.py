"""Ids that leave the database are never handed out twice (revision ``0007_unique_ids``).

A queue message's ``sequence_number`` and a dead letter's ``id`` are seen by consumers and
operators (a consumer may keep sequence numbers, ``outbox dead-letters requeue ID`` acts on an id
listed earlier, the console freezes a selection at the newest id). SQLite gives an
``INTEGER PRIMARY KEY`` without ``AUTOINCREMENT`` the highest id plus one, so the id of a deleted
newest row comes back; with ``AUTOINCREMENT`` it keeps the highest id ever used in
``sqlite_sequence`` and never goes below it. PostgreSQL's ``BIGSERIAL`` sequences never go back
already (a rolled-back or deleted row's number is gone), so there nothing changes.

Why a module of its own: the revision's steps are the mechanism, and ``tests/test_mutations.py``
breaks them here (alembic loads revision files under names of its own, out of a patch's reach).
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op


def never_reuse(table: str) -> None:
    """Recreate ``table`` with ``AUTOINCREMENT`` on SQLite, keeping every row and its id.

    Alembic's batch mode copies the rows into a new table (``INSERT .. SELECT``, ids included),
    drops the old one and renames the new one; the copy sets the table's ``sqlite_sequence`` row
    to its highest id, and the rename carries that row along. Indexes are recreated.
    """
    with op.batch_alter_table(
        table, recreate="always", table_kwargs={"sqlite_autoincrement": True}
    ):
        pass


def start_above(table: str, floor: int) -> None:
    """Make the next id of ``table`` (an ``AUTOINCREMENT`` table) greater than ``floor``."""
    if floor <= 0:
        return
    seq = sa.table("sqlite_sequence", sa.column("name", sa.Text), sa.column("seq", sa.Integer))
    bind = op.get_bind()
    moved = bind.execute(
        seq.update().where(seq.c.name == table).values(seq=sa.func.max(seq.c.seq, floor))
    )
    if moved.rowcount == 0:  # an empty table has no row yet
        bind.execute(seq.insert().values(name=table, seq=floor))


def highest(*columns: tuple[str, str]) -> int:
    """The highest value in any of the ``(table, column)`` pairs (0 when all are empty)."""
    bind = op.get_bind()
    found = [
        bind.execute(
            sa.select(sa.func.max(sa.column(column))).select_from(sa.table(table))
        ).scalar()
        for table, column in columns
    ]
    return max((int(v) for v in found if v is not None), default=0)


def unused_before_now() -> int:
    """A number above every id an existing SQLite table can have handed out: the microseconds
    since 1970.

    Why: without ``AUTOINCREMENT``, ids of deleted rows above the highest remaining one left no
    trace (a drained queue has no rows at all, and its next sequence number was 1 again), so
    the upgrade cannot read how far they went. Every id was one insert, and no table took a
    million inserts a second on average since 1970; so numbering on from here hands out no id
    twice, across the upgrade too. A new database has handed out nothing and counts from 1.
    """
    return time.time_ns() // 1000

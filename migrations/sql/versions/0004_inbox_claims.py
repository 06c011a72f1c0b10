"""Inbox claims: a consumer claims a message id before its handler runs.

``outbox_inbox`` gains ``owner`` and ``lease_until``, and ``handled_at`` may be NULL: a row with
``handled_at`` is a handled message id, a row without it a claim of ``owner`` until
``lease_until``. Every existing row has ``handled_at`` set, so it keeps meaning "handled".

Revision ID: 0004_inbox_claims
Revises: 0003_defer_and_schedule
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_inbox_claims"
down_revision = "0003_defer_and_schedule"
branch_labels = None
depends_on = None

_TABLE = "outbox_inbox"
_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    # batch_alter_table: SQLite cannot change a column's nullability through ALTER; the table is
    # recreated with its rows.
    with op.batch_alter_table(_TABLE) as batch:
        batch.alter_column("handled_at", existing_type=_ts, nullable=True)
        batch.add_column(sa.Column("owner", sa.String(260), nullable=True))
        batch.add_column(sa.Column("lease_until", _ts, nullable=True))


def downgrade() -> None:
    t = sa.table(_TABLE, sa.column("handled_at", _ts))
    op.execute(t.delete().where(t.c.handled_at.is_(None)))  # claims: nothing was handled yet
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_column("lease_until")
        batch.drop_column("owner")
        batch.alter_column("handled_at", existing_type=_ts, nullable=False)

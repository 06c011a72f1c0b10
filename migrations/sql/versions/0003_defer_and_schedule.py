"""Deferred messages and scheduled messages outside their session.

Two flags on outbox_queue_messages: ``deferred`` (set aside by ``defer``; received only by
sequence number) and ``scheduled`` (sent with a future ``not_before``: not in its session until
its time, as on Service Bus). Existing rows keep working: none is deferred, and a row never
delivered whose ``not_before`` is later than its enqueue time was scheduled by its sender.

Revision ID: 0003_defer_and_schedule
Revises: 0002_claim_log
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_defer_and_schedule"
down_revision = "0002_claim_log"
branch_labels = None
depends_on = None

_TABLE = "outbox_queue_messages"


def upgrade() -> None:
    # batch_alter_table: SQLite cannot add a NOT NULL column with a default in every version
    # through plain ALTER, and recreating the table keeps the rows (and their sequence numbers).
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(
            sa.Column("deferred", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("scheduled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    m = sa.table(
        _TABLE,
        sa.column("scheduled", sa.Boolean()),
        sa.column("delivery_count", sa.Integer()),
        sa.column("not_before", sa.DateTime(timezone=True)),
        sa.column("enqueued_at", sa.DateTime(timezone=True)),
    )
    op.execute(
        m.update()
        .where(m.c.delivery_count == 0, m.c.not_before > m.c.enqueued_at)
        .values(scheduled=True)
    )


def downgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_column("scheduled")
        batch.drop_column("deferred")

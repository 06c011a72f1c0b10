"""Replays from the table's history: a row per replay (its range, predicate, flags, the chunks
planned and enqueued) and a row per chunk sent.

``outbox replay`` plans the messages committed between two table versions and enqueues them in
chunks as commands; the worker that sends a chunk records it, so a chunk delivered twice (a
worker crash, a planner resumed after the queue forgot its ids) is sent once, and the progress is
a count. A replay that is not done holds the Delta log trim at the start of its range, as a
lagging rescuer does.

Revision ID: 0009_replays
Revises: 0008_key_holds
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_replays"
down_revision = "0008_key_holds"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_replays",
        sa.Column("replay_id", sa.String(64), nullable=False),
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("table_uri", sa.String(1024), nullable=False),
        sa.Column("from_version", sa.BigInteger, nullable=False),
        sa.Column("to_version", sa.BigInteger, nullable=False),
        sa.Column("predicate", sa.Text, nullable=True),
        sa.Column("destination", sa.String(260), nullable=True),
        sa.Column("new_ids", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("chunks", sa.BigInteger, nullable=True),
        sa.Column("messages", sa.BigInteger, nullable=True),
        sa.Column("enqueued", sa.BigInteger, nullable=False),
        sa.Column("details", sa.Text, nullable=True),
        sa.Column("created_at", _ts, nullable=False),
        sa.Column("updated_at", _ts, nullable=False),
        sa.Column("finished_at", _ts, nullable=True),
        sa.PrimaryKeyConstraint("replay_id", name="pk_outbox_replays"),
    )
    op.create_table(
        "outbox_replay_chunks",
        sa.Column("replay_id", sa.String(64), nullable=False),
        sa.Column("chunk", sa.BigInteger, nullable=False),
        sa.Column("messages", sa.BigInteger, nullable=False),
        sa.Column("sent_at", _ts, nullable=False),
        sa.PrimaryKeyConstraint("replay_id", "chunk", name="pk_outbox_replay_chunks"),
    )


def downgrade() -> None:
    op.drop_table("outbox_replay_chunks")
    op.drop_table("outbox_replays")

"""Paused ordering keys, shared by every process that sends.

``outbox_key_holds`` holds each paused key's line (``dispatcher.queue.key_lines``): one row per
run of one document's messages held behind the key's gate, in the order they were held (the
ids, never reused). A key with rows is paused; its lowest row is the gate. The writer's
immediate dispatch, the command worker and the Spark job all read and write it, so documents
held in one process leave in commit order whichever process sends them (docs/dispatcher.md,
"Order per ordering key").

Revision ID: 0008_key_holds
Revises: 0007_unique_ids
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_key_holds"
down_revision = "0007_unique_ids"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)
_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "outbox_key_holds",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("destination", sa.String(260), nullable=False),
        sa.Column("ordering_key", sa.String(128), nullable=False),
        sa.Column("doc_id", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.String(64), nullable=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("since", _ts, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_outbox_key_holds_key", "outbox_key_holds", ["destination", "ordering_key", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_key_holds_key", table_name="outbox_key_holds")
    op.drop_table("outbox_key_holds")

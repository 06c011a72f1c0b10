"""The queue, dead letters, duplicate-detection ids, rescuer checkpoints and consumer inbox.

Revision ID: 0001_initial
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

_seq = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_ts = sa.DateTime(timezone=True)


def _message_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("queue", sa.String(260), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("content_type", sa.String(256), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=True),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("enqueued_at", _ts, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "outbox_queue_messages",
        sa.Column("sequence_number", _seq, primary_key=True, autoincrement=True),
        *_message_columns(),
        sa.Column("not_before", _ts, nullable=False),
        sa.Column("delivery_count", sa.Integer(), nullable=False),
        sa.Column("lock_token", sa.String(36), nullable=True),
        sa.Column("locked_until", _ts, nullable=True),
    )
    op.create_index(
        "ix_outbox_queue_messages_receive", "outbox_queue_messages", ["queue", "sequence_number"]
    )
    op.create_index(
        "ix_outbox_queue_messages_session",
        "outbox_queue_messages",
        ["queue", "session_id", "sequence_number"],
    )
    op.create_index("ix_outbox_queue_messages_lock_token", "outbox_queue_messages", ["lock_token"])

    op.create_table(
        "outbox_queue_dead_letters",
        sa.Column("id", _seq, primary_key=True, autoincrement=True),
        *_message_columns(),
        sa.Column("sequence_number", sa.BigInteger(), nullable=False),
        sa.Column("delivery_count", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(256), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("dead_lettered_at", _ts, nullable=False),
    )
    op.create_index(
        "ix_outbox_queue_dead_letters_queue", "outbox_queue_dead_letters", ["queue", "id"]
    )

    op.create_table(
        "outbox_queue_duplicate_ids",
        sa.Column("queue", sa.String(260), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("seen_at", _ts, nullable=False),
        sa.PrimaryKeyConstraint("queue", "message_id", name="pk_outbox_queue_duplicate_ids"),
    )
    op.create_index(
        "ix_outbox_queue_duplicate_ids_seen_at", "outbox_queue_duplicate_ids", ["seen_at"]
    )

    op.create_table(
        "outbox_checkpoints",
        sa.Column("table_uri", sa.String(1024), nullable=False),
        sa.Column("rescuer_name", sa.String(256), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("last_pass_at", _ts, nullable=True),
        sa.Column("updated_at", _ts, nullable=False),
        sa.Column("details", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("table_uri", "rescuer_name", name="pk_outbox_checkpoints"),
    )

    op.create_table(
        "outbox_inbox",
        sa.Column("consumer", sa.String(260), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("handled_at", _ts, nullable=False),
        sa.PrimaryKeyConstraint("consumer", "message_id", name="pk_outbox_inbox"),
    )


def downgrade() -> None:
    for table in (
        "outbox_inbox",
        "outbox_checkpoints",
        "outbox_queue_duplicate_ids",
        "outbox_queue_dead_letters",
        "outbox_queue_messages",
    ):
        op.drop_table(table)

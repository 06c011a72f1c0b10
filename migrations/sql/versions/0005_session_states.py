"""Session states: a paused session is left out of every receive, and a lock says when it was
taken (device fleets).

``outbox_queue_sessions`` holds a session's state when it has one: ``paused`` (the MQTT gateway
pauses the session of a device that went offline, so its tasks wait without using up tries),
``state`` (a word for people: ``online``/``offline``) and ``since`` (when it changed). A session
without a row is not paused. ``outbox_queue_messages.locked_at`` is when the current (or last)
lock was taken: with ``delivery_count`` and ``locked_until`` it is a gateway's "tries, last try,
next try", stored where every gateway process and ``outbox devices`` can read them.

Revision ID: 0005_session_states
Revises: 0004_inbox_claims
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_session_states"
down_revision = "0004_inbox_claims"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_queue_sessions",
        sa.Column("queue", sa.String(260), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("state", sa.String(32), nullable=True),
        sa.Column("since", _ts, nullable=False),
        sa.Column("updated_at", _ts, nullable=False),
        sa.PrimaryKeyConstraint("queue", "session_id", name="pk_outbox_queue_sessions"),
    )
    with op.batch_alter_table("outbox_queue_messages") as batch:
        batch.add_column(sa.Column("locked_at", _ts, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox_queue_messages") as batch:
        batch.drop_column("locked_at")
    op.drop_table("outbox_queue_sessions")

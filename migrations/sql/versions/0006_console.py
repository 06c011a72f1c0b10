"""The console: a history of samples, and indexes for paging dead letters by reason, time and
device.

``outbox_samples`` holds one number per metric, subject and sampling slot (its start in
seconds since the epoch): the pending
documents, the oldest pending age and each rescuer's lag, recorded by the processes that already
run (the dispatcher, each rescue pass), so ``outbox console`` charts them without Prometheus
(docs/console.md). A slot's key is its start, so two processes sampling the same slot write one
row. The dead letters gain the indexes the console's filters need to answer within 200 ms at
100,000 dead letters: by reason, by time, and by device (a session of a queue); the claim log
gains one by status, for the geo claims in flight a sample counts.

Revision ID: 0006_console
Revises: 0005_session_states
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_console"
down_revision = "0005_session_states"
branch_labels = None
depends_on = None

_DEAD = "outbox_queue_dead_letters"


def upgrade() -> None:
    op.create_table(
        "outbox_samples",
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(260), nullable=False),
        sa.Column("taken_at_s", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("source", sa.String(260), nullable=False),
        sa.PrimaryKeyConstraint("metric", "subject", "taken_at_s", name="pk_outbox_samples"),
    )
    op.create_index(
        "ix_outbox_samples_range",
        "outbox_samples",
        ["metric", "taken_at_s", "subject", "value"],
    )
    op.create_index("ix_outbox_samples_taken_at_s", "outbox_samples", ["taken_at_s"])
    op.create_index("ix_outbox_queue_dead_letters_reason", _DEAD, ["reason", "id"])
    op.create_index("ix_outbox_queue_dead_letters_queue_reason", _DEAD, ["queue", "reason", "id"])
    op.create_index("ix_outbox_queue_dead_letters_at", _DEAD, ["dead_lettered_at", "id"])
    op.create_index(
        "ix_outbox_queue_dead_letters_queue_at", _DEAD, ["queue", "dead_lettered_at", "id"]
    )
    op.create_index("ix_outbox_queue_dead_letters_session", _DEAD, ["queue", "session_id", "id"])
    op.create_index("ix_outbox_claims_status", "outbox_claims", ["status"])


def downgrade() -> None:
    op.drop_index("ix_outbox_claims_status", "outbox_claims")
    op.drop_index("ix_outbox_queue_dead_letters_session", _DEAD)
    op.drop_index("ix_outbox_queue_dead_letters_queue_at", _DEAD)
    op.drop_index("ix_outbox_queue_dead_letters_at", _DEAD)
    op.drop_index("ix_outbox_queue_dead_letters_queue_reason", _DEAD)
    op.drop_index("ix_outbox_queue_dead_letters_reason", _DEAD)
    op.drop_index("ix_outbox_samples_taken_at_s", "outbox_samples")
    op.drop_index("ix_outbox_samples_range", "outbox_samples")
    op.drop_table("outbox_samples")

"""The claim log of two regions: outbox_claims and outbox_claim_sessions.

Revision ID: 0002_claim_log
Revises: 0001_initial
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_claim_log"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_claims",
        sa.Column("claim_key", sa.String(300), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("position", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(260), nullable=True),
        sa.Column("lease_until", _ts, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", _ts, nullable=False),
        sa.PrimaryKeyConstraint("claim_key", name="pk_outbox_claims"),
    )
    op.create_index("ix_outbox_claims_session", "outbox_claims", ["session_id", "position"])
    op.create_table(
        "outbox_claim_sessions",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("next_position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_outbox_claim_sessions"),
    )


def downgrade() -> None:
    op.drop_table("outbox_claim_sessions")
    op.drop_index("ix_outbox_claims_session", table_name="outbox_claims")
    op.drop_table("outbox_claims")

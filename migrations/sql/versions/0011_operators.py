"""Named console operators and the audit trail (outbox.app.operators).

``outbox_console_tokens``: one row per named token (its name, role, the SHA-256 of the token,
when it was made and, once revoked, when). ``outbox_audit``: one row per action an operator or
the CLI took on the queue's contents (who, when, what, which ids, the outcome), newest by id.

Revision ID: 0011_operators
Revises: 0010_erasures
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_operators"
down_revision = "0010_erasures"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_console_tokens",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", _ts, nullable=False),
        sa.Column("revoked_at", _ts, nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_outbox_console_tokens"),
    )
    op.create_index(
        "ix_outbox_console_tokens_sha256", "outbox_console_tokens", ["token_sha256"], unique=True
    )
    op.create_table(
        "outbox_audit",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", _ts, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("outcome", sa.String(512), nullable=False),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("outbox_audit")
    op.drop_index("ix_outbox_console_tokens_sha256", table_name="outbox_console_tokens")
    op.drop_table("outbox_console_tokens")

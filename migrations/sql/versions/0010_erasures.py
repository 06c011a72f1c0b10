"""The erasure ledger: one row per document erased from a table (outbox.app.erasure).

``outbox erase`` writes a row when it starts, marks it ``erased`` with the table version of its
erase commit, and ``outbox maintain`` finishes it (``done``) once the log trim has passed that
version and the old files are gone; the document id is then replaced by its hash.

Revision ID: 0010_erasures
Revises: 0008_key_holds
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_erasures"
down_revision = "0009_replays"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox_erasures",
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("doc_id", sa.String(128), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("erased_version", sa.BigInteger, nullable=True),
        sa.Column("requested_at", _ts, nullable=False),
        sa.Column("erased_at", _ts, nullable=True),
        sa.Column("finished_at", _ts, nullable=True),
        sa.PrimaryKeyConstraint("table_id", "doc_id", name="pk_outbox_erasures"),
    )
    op.create_index("ix_outbox_erasures_phase", "outbox_erasures", ["table_id", "phase"])


def downgrade() -> None:
    op.drop_index("ix_outbox_erasures_phase", table_name="outbox_erasures")
    op.drop_table("outbox_erasures")

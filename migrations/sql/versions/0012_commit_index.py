"""The trace's index of which commits touched which documents (outbox.app.trace.index).

``outbox_commit_index``: one row per (table, document, table version) the document changed in,
read from the Delta log and the files each commit wrote. ``outbox_commit_index_cursor``: per
table, the newest version every commit up to which is indexed. A derived cache: the trace
rebuilds what is missing.

Revision ID: 0012_commit_index
Revises: 0011_operators
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_commit_index"
down_revision = "0011_operators"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_commit_index",
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("document_id", sa.String(128), nullable=False),
        sa.Column("table_version", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "table_id", "document_id", "table_version", name="pk_outbox_commit_index"
        ),
    )
    op.create_index(
        "ix_outbox_commit_index_version", "outbox_commit_index", ["table_id", "table_version"]
    )
    op.create_table(
        "outbox_commit_index_cursor",
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("indexed_to", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("table_id", name="pk_outbox_commit_index_cursor"),
    )


def downgrade() -> None:
    op.drop_table("outbox_commit_index_cursor")
    op.drop_index("ix_outbox_commit_index_version", table_name="outbox_commit_index")
    op.drop_table("outbox_commit_index")

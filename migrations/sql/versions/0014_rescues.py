"""The rescuer's journal: which documents each pass commanded (rescuer.journal; issue 46, item 1).

``outbox_rescues``: one row per ``ProcessDocument`` command a rescue pass enqueued (the table,
the document, the seq it covers, the command's id, the pass's rescuer, engine, mode and window
end, and when), so the trace can say the rescuer touched a document after its command is gone.

Revision ID: 0014_rescues
Revises: 0013_commit_index_rows
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_rescues"
down_revision = "0013_commit_index_rows"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_rescues",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("doc_id", sa.String(128), nullable=False),
        sa.Column("up_to_seq", sa.BigInteger, nullable=False),
        sa.Column("command_id", sa.String(128), nullable=False),
        sa.Column("rescuer", sa.String(128), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("window_end", sa.BigInteger, nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_outbox_rescues_doc", "outbox_rescues", ["table_id", "doc_id", "id"])
    op.create_index("ix_outbox_rescues_at", "outbox_rescues", ["at"])


def downgrade() -> None:
    op.drop_index("ix_outbox_rescues_at", table_name="outbox_rescues")
    op.drop_index("ix_outbox_rescues_doc", table_name="outbox_rescues")
    op.drop_table("outbox_rescues")

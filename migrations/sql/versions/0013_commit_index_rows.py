"""The trace's index holds what a trace shows (outbox.app.trace.index; issue 46, item 1).

``outbox_commit_index`` gets a row per change row (not per commit): its change type, the
document's version, its sequence numbers and the ids of the messages it carries, so a trace
reads no data file. ``outbox_commit_index_messages``: each message once per document (what its
fate needs, and its newest version, for the prune), also found by message or correlation id.
The index is a derived cache: its rows and cursors are dropped and rebuilt by the next trace.

Revision ID: 0013_commit_index_rows
Revises: 0012_commit_index
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_commit_index_rows"
down_revision = "0012_commit_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_outbox_commit_index_version", table_name="outbox_commit_index")
    op.drop_table("outbox_commit_index")
    op.execute("DELETE FROM outbox_commit_index_cursor")
    op.create_table(
        "outbox_commit_index",
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("document_id", sa.String(128), nullable=False),
        sa.Column("table_version", sa.BigInteger, nullable=False),
        sa.Column("row_no", sa.Integer, nullable=False),
        sa.Column("change", sa.String(32), nullable=False),
        sa.Column("document_version", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("dispatched_seq", sa.BigInteger, nullable=False),
        sa.Column("messages", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint(
            "table_id", "document_id", "table_version", "row_no", name="pk_outbox_commit_index"
        ),
    )
    op.create_index(
        "ix_outbox_commit_index_version", "outbox_commit_index", ["table_id", "table_version"]
    )
    op.create_table(
        "outbox_commit_index_messages",
        sa.Column("table_id", sa.String(64), nullable=False),
        sa.Column("document_id", sa.String(128), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("destination", sa.String(260), nullable=False),
        sa.Column("type", sa.String(256), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_version", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint(
            "table_id", "document_id", "message_id", name="pk_outbox_commit_index_messages"
        ),
    )
    for name, columns in _MESSAGE_INDEXES:
        op.create_index(name, "outbox_commit_index_messages", ["table_id", columns])


_MESSAGE_INDEXES = (
    ("ix_outbox_commit_index_messages_id", "message_id"),
    ("ix_outbox_commit_index_messages_correlation", "correlation_id"),
    ("ix_outbox_commit_index_messages_last", "last_version"),
)


def downgrade() -> None:
    for name, _ in _MESSAGE_INDEXES:
        op.drop_index(name, table_name="outbox_commit_index_messages")
    op.drop_table("outbox_commit_index_messages")
    op.drop_index("ix_outbox_commit_index_version", table_name="outbox_commit_index")
    op.drop_table("outbox_commit_index")
    op.execute("DELETE FROM outbox_commit_index_cursor")
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

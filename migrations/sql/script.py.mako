"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    # A new database is created from migrations/sql/tables.py at the head, not by these
    # revisions: make the same change there (tests/queue/test_fresh_schema.py compares the two).
    # On SQLite a batch copy of an AUTOINCREMENT table must pass table_kwargs=
    # {"sqlite_autoincrement": True} and carry its sqlite_sequence over (migrations.sql.ids).
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}

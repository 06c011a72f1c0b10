"""Sequence numbers and dead letter ids are never reused.

On SQLite ``outbox_queue_messages`` and ``outbox_queue_dead_letters`` are recreated with
``AUTOINCREMENT`` (every row and its id kept), so the id of a deleted newest row never comes back:
a message sent after the newest one was completed gets a new sequence number, a dead letter that
arrives after the newest one was requeued or purged gets a new id. A database that already held
data numbers on from the upgrade's time in microseconds since 1970 (``migrations.sql.ids``
says why); a new one counts from 1. PostgreSQL's sequences never reuse a number: nothing changes
there.

Revision ID: 0007_unique_ids
Revises: 0006_console
Create Date: 2026-12-10
"""

from __future__ import annotations

from alembic import context, op

from migrations.sql import UPGRADING_FROM, ids

revision = "0007_unique_ids"
down_revision = "0006_console"
branch_labels = None
depends_on = None

_MESSAGES = "outbox_queue_messages"
_DEAD = "outbox_queue_dead_letters"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    # None: this run created the database, which has handed out no id yet. Unknown (alembic run
    # by hand) counts as a database with a history.
    new = context.config.attributes.get(UPGRADING_FROM, "unknown") is None
    since = 0 if new else ids.unused_before_now()
    # a dead letter keeps its message's sequence number: one more trace of numbers handed out
    message_floor = max(
        since, ids.highest((_MESSAGES, "sequence_number"), (_DEAD, "sequence_number"))
    )
    dead_floor = max(since, ids.highest((_DEAD, "id")))
    ids.never_reuse(_MESSAGES)
    ids.never_reuse(_DEAD)
    ids.start_above(_MESSAGES, message_floor)
    ids.start_above(_DEAD, dead_floor)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in (_DEAD, _MESSAGES):
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": False}
        ):
            pass

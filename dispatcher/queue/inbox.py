"""Where a consumer remembers which message ids it has handled, so a repeat is dropped.

Why a port: the SQL inbox (``outbox_inbox``, the default) can join the handler's own transaction;
an inbox in another store (``inbox_cosmos.CosmosInbox``) cannot, and the consumer orders its steps
differently for each (``Consumer``'s docstring). Both say the same two things: has this id been
handled, and record it once (the first recorder wins, any repeat learns it was second).

An inbox is keyed by a consumer name: two consumers of one queue keep separate records.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from dispatcher.queue.database import Database

log = logging.getLogger("outbox.queue.consumer")


@runtime_checkable
class Inbox(Protocol):
    """Handled message ids of one consumer."""

    #: the consumer name the records are kept under
    consumer: str

    def handled(self, message_id: str) -> bool:
        """True when ``message_id`` was recorded for this consumer."""
        ...

    def record(self, message_id: str, *, at: datetime) -> bool:
        """Record ``message_id`` as handled; False when it already was (someone recorded first).

        Idempotent and safe under races: of many concurrent calls for one id exactly one returns
        True.
        """
        ...


@runtime_checkable
class TransactionalInbox(Inbox, Protocol):
    """An inbox in the queue's own SQL database: its record can commit with the handler's work
    and the message's completion, in one transaction."""

    def record_in(self, conn: Connection, message_id: str, *, at: datetime) -> bool:
        """``record`` inside the open transaction ``conn`` (rolled back with it)."""
        ...


class SqlInbox:
    """Handled ids in ``outbox_inbox`` (created by ``outbox migrate``), keyed by consumer name."""

    def __init__(self, database: Database, consumer: str) -> None:
        self.database = database
        self.consumer = consumer

    def handled(self, message_id: str) -> bool:
        from sqlalchemy import exists, select

        from migrations.sql.tables import inbox

        with self.database.read("read the inbox") as conn:
            return bool(
                conn.execute(
                    select(
                        exists().where(
                            inbox.c.consumer == self.consumer, inbox.c.message_id == message_id
                        )
                    )
                ).scalar()
            )

    def record(self, message_id: str, *, at: datetime) -> bool:
        with self.database.write("record a handled message") as conn:
            return self.record_in(conn, message_id, at=at)

    def record_in(self, conn: Connection, message_id: str, *, at: datetime) -> bool:
        from sqlalchemy import exists, select
        from sqlalchemy.exc import IntegrityError

        from migrations.sql.tables import inbox

        seen = conn.execute(
            select(
                exists().where(inbox.c.consumer == self.consumer, inbox.c.message_id == message_id)
            )
        ).scalar()
        if seen:
            log.info("message %s was already handled; dropping the repeat", message_id)
            return False
        try:
            with conn.begin_nested():
                conn.execute(
                    inbox.insert().values(
                        consumer=self.consumer, message_id=message_id, handled_at=at
                    )
                )
        except IntegrityError:  # a concurrent consumer recorded it first
            return False
        return True

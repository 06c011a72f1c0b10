"""Where a consumer remembers which message ids it has handled, and who is handling one now.

Why a port: the SQL inbox (``outbox_inbox``, the default) can join the handler's own transaction;
an inbox in another store (``inbox_cosmos.CosmosInbox``) cannot, and the consumer orders its steps
differently for each (``Consumer``'s docstring). Every inbox says the same things:

* **claim** a message id before its handler runs: won (run it), already handled (drop the
  repeat), or held by another live claim until its lease ends (wait; never drop it: the holder
  may crash). A claim whose lease ended is taken over: its handler crashed or hung.
* **renew** the claim while the handler runs, **record** the id as handled when it returned
  (the first recorder wins), or **release** the claim when it failed, so a retry may claim it
  at once.

So concurrent deliveries of one message id (a resend outside the queue's duplicate detection,
copies in two regions, several consumer threads or processes) never run the handler at the same
time: one wins the claim, the others wait until it is recorded (then they are dropped) or until
its lease ends (then one of them takes over).

What each mode guarantees (``Consumer`` picks the mode):

* **SQL inbox, handler that takes a Connection** (``TransactionalInbox``): claim, handler SQL
  work, record and the message's completion commit in ONE transaction; the claim is never seen
  uncommitted, a concurrent duplicate waits for that transaction (PostgreSQL: the row lock;
  SQLite: the single writer) and then finds the id handled. Exactly-once effect in that database.
* **SQL inbox with a handler without a Connection, or any other inbox** (``CosmosInbox``): at most
  one handler at a time per message id per consumer name; a handler runs again only after a
  failure (the claim is released), or a crash or hang (the claim's lease ends). At-least-once
  with no concurrent duplicates: effects outside the inbox's store must tolerate a second run in
  those cases.

An inbox is keyed by a consumer name: two consumers of one queue keep separate records.

Records do not pile up for ever (``inbox_pruning``): an id handled longer ago than the retention
(``inbox_retention``) is deleted, with claims that were released or whose lease ended that long
ago; a live claim never is.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dispatcher.queue.renewal import LeaseRenewer, Renewal
from outbox.core.clock import Clock, utc
from outbox.core.errors import OutboxError, QueueUnavailableError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from dispatcher.queue.database import Database

log = logging.getLogger("outbox.queue.consumer")

#: Looks at a row that keeps changing under a claim before giving up (retryable).
_ATTEMPTS = 20
#: Rows a prune deletes per transaction (SQLite holds its write lock for each).
PRUNE_CHUNK = 1000


class ClaimOutcome(StrEnum):
    WON = "won"  # the caller holds the claim until ``lease_until``: run the handler
    HANDLED = "handled"  # the id was recorded as handled: drop the repeat
    HELD = "held"  # another owner's claim is live until ``lease_until``: wait, then look again


@dataclass(frozen=True, slots=True)
class InboxClaim:
    """The outcome of ``Inbox.claim``: who holds the id and until when (None once handled)."""

    outcome: ClaimOutcome
    owner: str | None
    lease_until: datetime | None

    @property
    def won(self) -> bool:
        return self.outcome is ClaimOutcome.WON

    @property
    def handled(self) -> bool:
        return self.outcome is ClaimOutcome.HANDLED

    @property
    def held(self) -> bool:
        return self.outcome is ClaimOutcome.HELD


@runtime_checkable
class Inbox(Protocol):
    """Handled message ids of one consumer, and the live claims on ids being handled."""

    #: the consumer name the records are kept under
    consumer: str

    def handled(self, message_id: str) -> bool:
        """True when ``message_id`` was recorded as handled for this consumer (a live or expired
        claim is not handled)."""
        ...

    def claim(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> InboxClaim:
        """Take ``message_id`` for ``owner`` until ``at + lease``, in one atomic step.

        Won: the id is unknown, released, claimed under a lease that ended at or before ``at``
        (taken over), or already ``owner``'s (renewed). Handled: it was recorded. Held: another
        owner's lease is live at ``at``. Of many concurrent claims of a free id exactly one wins.
        """
        ...

    def renew(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> bool:
        """Extend ``owner``'s claim to ``at + lease``; False when ``owner`` no longer holds it
        (taken over, released or recorded meanwhile)."""
        ...

    def release(self, message_id: str, owner: str) -> None:
        """Give up ``owner``'s claim (its handler failed): anyone may claim the id at once.
        Nothing happens when ``owner`` does not hold it."""
        ...

    def record(self, message_id: str, *, at: datetime) -> bool:
        """Record ``message_id`` as handled, claimed or not; False when it already was.

        Idempotent and safe under races: of many concurrent calls for one id exactly one returns
        True. A recorded id stays handled (claims of it return ``HANDLED`` from then on).
        """
        ...


@runtime_checkable
class TransactionalInbox(Inbox, Protocol):
    """An inbox in a SQL database: its claim and record can commit with the handler's work and
    the message's completion, in one transaction of the queue's database."""

    def joins(self, database: Database) -> bool:
        """True when this inbox lives in ``database`` (so it can join its transactions)."""
        ...

    def claim_in(
        self, conn: Connection, message_id: str, owner: str, *, lease: timedelta, at: datetime
    ) -> InboxClaim:
        """``claim`` inside the open transaction ``conn`` (rolled back with it)."""
        ...

    def record_in(self, conn: Connection, message_id: str, *, at: datetime) -> bool:
        """``record`` inside the open transaction ``conn`` (rolled back with it)."""
        ...


class SqlInbox:
    """Handled ids and live claims in ``outbox_inbox`` (``outbox migrate``), keyed by consumer.

    A row with ``handled_at`` set is handled (rows written before revision 0004 all are); a row
    without it is a claim of ``owner`` until ``lease_until`` (NULL: released). A claim is one
    ``INSERT .. ON CONFLICT DO UPDATE .. WHERE <free> RETURNING`` on SQLite and PostgreSQL: the
    primary key lets one claimer insert, the conflict's ``WHERE`` lets one take a free row over
    (PostgreSQL locks the row and re-checks it; SQLite has one writer).
    """

    def __init__(self, database: Database, consumer: str) -> None:
        self.database = database
        self.consumer = consumer

    def joins(self, database: Database) -> bool:
        return database is self.database or database.engine.url == self.database.engine.url

    def _key(self, message_id: str) -> Any:
        from sqlalchemy import and_

        from migrations.sql.tables import inbox

        return and_(inbox.c.consumer == self.consumer, inbox.c.message_id == message_id)

    @staticmethod
    def _insert(conn: Connection) -> Any:
        """The dialect's INSERT, which has ``on_conflict_do_update``."""
        from migrations.sql.tables import inbox

        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(inbox)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(inbox)

    def handled(self, message_id: str) -> bool:
        from sqlalchemy import exists, select

        from migrations.sql.tables import inbox

        with self.database.read("read the inbox") as conn:
            return bool(
                conn.execute(
                    select(exists().where(self._key(message_id), inbox.c.handled_at.is_not(None)))
                ).scalar()
            )

    def claim(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> InboxClaim:
        with self.database.write("claim a message in the inbox") as conn:
            return self.claim_in(conn, message_id, owner, lease=lease, at=at)

    def claim_in(
        self, conn: Connection, message_id: str, owner: str, *, lease: timedelta, at: datetime
    ) -> InboxClaim:
        from sqlalchemy import or_, select

        from migrations.sql.tables import inbox

        until = at + lease
        c = inbox.c
        for _ in range(_ATTEMPTS):
            stmt = self._insert(conn).values(
                consumer=self.consumer,
                message_id=message_id,
                handled_at=None,
                owner=owner,
                lease_until=until,
            )
            stmt = stmt.on_conflict_do_update(
                index_elements=[c.consumer, c.message_id],
                set_={"owner": stmt.excluded.owner, "lease_until": stmt.excluded.lease_until},
                where=c.handled_at.is_(None)
                & or_(c.lease_until.is_(None), c.lease_until <= at, c.owner == owner),
            ).returning(c.message_id)
            if conn.execute(stmt).first() is not None:
                return InboxClaim(ClaimOutcome.WON, owner, until)
            row = conn.execute(
                select(c.handled_at, c.owner, c.lease_until).where(self._key(message_id))
            ).first()
            if row is not None and row.handled_at is not None:
                return InboxClaim(ClaimOutcome.HANDLED, row.owner, None)
            if row is None or row.lease_until is None or utc(row.lease_until) <= utc(at):
                continue  # released, or deleted by hand, since the upsert: claim again
            return InboxClaim(ClaimOutcome.HELD, row.owner, utc(row.lease_until))
        raise QueueUnavailableError(f"claiming message {message_id!r} in the inbox: it kept moving")

    def renew(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> bool:
        return self._move("renew an inbox claim", message_id, owner, {"lease_until": at + lease})

    def release(self, message_id: str, owner: str) -> None:
        self._move(
            "release an inbox claim", message_id, owner, {"owner": None, "lease_until": None}
        )

    def _move(self, action: str, message_id: str, owner: str, values: dict[str, Any]) -> bool:
        from sqlalchemy import update

        from migrations.sql.tables import inbox

        with self.database.write(action) as conn:
            done = conn.execute(
                update(inbox)
                .where(self._key(message_id), inbox.c.owner == owner, inbox.c.handled_at.is_(None))
                .values(**values)
            )
            return done.rowcount == 1

    def record(self, message_id: str, *, at: datetime) -> bool:
        with self.database.write("record a handled message") as conn:
            return self.record_in(conn, message_id, at=at)

    def record_in(self, conn: Connection, message_id: str, *, at: datetime) -> bool:
        from migrations.sql.tables import inbox

        c = inbox.c
        stmt = self._insert(conn).values(
            consumer=self.consumer, message_id=message_id, handled_at=at, owner=None
        )
        stmt = stmt.on_conflict_do_update(  # the claim's owner stays, as who handled it
            index_elements=[c.consumer, c.message_id],
            set_={"handled_at": stmt.excluded.handled_at, "lease_until": None},
            where=c.handled_at.is_(None),
        ).returning(c.message_id)
        if conn.execute(stmt).first() is None:
            log.info("message %s was already handled; dropping the repeat", message_id)
            return False
        return True

    def prune(
        self, before: datetime, *, limit: int | None = None, every_consumer: bool = False
    ) -> int:
        """See ``inbox_pruning.PrunableInbox.prune``: ``PRUNE_CHUNK`` rows per write transaction.

        The condition is on the ``DELETE`` itself, not only on the rows it picked: a released
        claim taken again in between (PostgreSQL re-checks a changed row) stays."""
        from sqlalchemy import and_, delete, or_, select, tuple_

        from migrations.sql.tables import inbox

        c = inbox.c
        done = or_(
            c.handled_at < before,
            and_(c.handled_at.is_(None), or_(c.lease_until.is_(None), c.lease_until < before)),
        )
        where = [done] if every_consumer else [c.consumer == self.consumer, done]
        deleted = 0
        while limit is None or deleted < limit:
            chunk = PRUNE_CHUNK if limit is None else min(PRUNE_CHUNK, limit - deleted)
            picked = select(c.consumer, c.message_id).where(*where).limit(chunk)
            with self.database.write("prune the inbox") as conn:
                stmt = delete(inbox).where(tuple_(c.consumer, c.message_id).in_(picked), *where)
                gone = int(conn.execute(stmt).rowcount)
            deleted += gone
            if gone < chunk:
                break
        return deleted


class ClaimKeeper:
    """The inbox claims of one consumer's running handlers: taken before a handler runs, renewed
    in the background once half a lease has passed (``renewal.LeaseRenewer``, as the queue's
    locks are), forgotten when the handler returns, released when it failed."""

    def __init__(
        self, inbox: Inbox, clock: Clock, lease: timedelta, *, check_interval: float = 1.0
    ) -> None:
        self.inbox = inbox
        self.clock = clock
        self.lease = lease
        self.check_interval = check_interval
        #: (message id, owner) -> lease end
        self._leases: LeaseRenewer[tuple[str, str]] = LeaseRenewer(
            self._renew,
            clock,
            lease,
            name="outbox-inbox-renewer",
            check_interval=check_interval,
            on_lost=self._lost,
        )

    @property
    def renewals(self) -> int:
        """Claims renewed so far."""
        return self._leases.renewals

    def take(self, message_id: str, owner: str) -> InboxClaim:
        claim = self.inbox.claim(message_id, owner, lease=self.lease, at=self.clock.now())
        if claim.won and claim.lease_until is not None:
            self._leases.hold((message_id, owner), claim.lease_until)
        return claim

    def forget(self, message_id: str, owner: str) -> None:
        """Stop renewing (the handler returned)."""
        self._leases.forget((message_id, owner))

    def release(self, message_id: str, owner: str) -> None:
        """Stop renewing and give the claim up; a failure is logged (the lease ends by itself)."""
        self.forget(message_id, owner)
        try:
            self.inbox.release(message_id, owner)
        except OutboxError as e:
            log.warning("could not release the inbox claim of %s: %s", message_id, e)

    def renewing(self) -> AbstractContextManager[None]:
        """Renew the claims taken in the background for the ``with`` block."""
        return self._leases.renewing()

    def _renew(self, key: tuple[str, str], now: datetime) -> datetime | Renewal:
        message_id, owner = key
        try:
            kept = self.inbox.renew(message_id, owner, lease=self.lease, at=now)
        except OutboxError as e:  # retried next tick, while the lease lasts
            log.warning("could not renew the inbox claim of %s: %s", message_id, e)
            return Renewal.LATER
        return now + self.lease if kept else Renewal.LOST

    @staticmethod
    def _lost(key: tuple[str, str]) -> None:
        log.warning(
            "the inbox claim of %s was lost (its lease ended and another delivery took it "
            "over): the handler may run twice",
            key[0],
        )

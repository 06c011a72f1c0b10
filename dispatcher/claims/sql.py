"""The claim log in a SQL database (SQLite or PostgreSQL, SQLAlchemy Core): a claim is an insert
that only one claimer can make (the primary key), every later move is an update guarded by the
row's ``version`` (compare-and-set), and positions come from a per-session counter row that
``register`` locks for its transaction.

The tables (``outbox_claims``, ``outbox_claim_sessions``) are created by ``outbox migrate``
(Alembic revision 0002). Both regions must reach the same database: a PostgreSQL server (or a
SQLite file for tests and a single host). Driver errors leave as ``ClaimLogUnavailableError``
(retryable) or ``ClaimLogError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Row, and_, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from dispatcher.claims.ports import ClaimEntry, ClaimStatus, OwnedMoves, Taken
from migrations.sql.tables import claim_sessions, claims
from outbox.core import sql
from outbox.core.clock import utc
from outbox.core.errors import (
    ClaimLogError,
    ClaimLogUnavailableError,
    ClaimLostError,
    OutboxError,
    QueueUnavailableError,
)

C = claims.c
T = TypeVar("T")


def _entry(row: Row[Any]) -> ClaimEntry:
    lease = row.lease_until
    return ClaimEntry(
        key=row.claim_key,
        status=ClaimStatus(row.status),
        owner=row.owner,
        lease_until=None if lease is None else utc(lease),
        attempts=int(row.attempts),
        updated_at=utc(row.updated_at),
        session=row.session_id,
        position=None if row.position is None else int(row.position),
    )


class SqlClaimLog(OwnedMoves):
    """A ``ClaimLog`` over ``outbox_claims``; ``url`` or an ``engine`` the caller owns."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        if engine is None:
            if url is None:
                raise ClaimLogError("SqlClaimLog needs a database url or an engine")
            engine = sql.make_engine(url)
            self._owned = True
        else:
            self._owned = False
        self.engine = engine

    def close(self) -> None:
        if self._owned:
            self.engine.dispose()

    # --- the edge: transactions with errors translated --------------------------------------

    @contextmanager
    def _tx(self, action: str) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except OutboxError:
            raise
        except SQLAlchemyError as e:
            err = sql.translate(e, self.engine, action, what="claim log database")
            kind = (
                ClaimLogUnavailableError
                if isinstance(err, QueueUnavailableError)
                else ClaimLogError
            )
            raise kind(str(err)) from e

    def _run(self, action: str, work: Callable[[Connection], T]) -> T:
        with self._tx(action) as conn:
            return work(conn)

    @staticmethod
    def _read(conn: Connection, key: str) -> ClaimEntry | None:
        row = conn.execute(select(claims).where(C.claim_key == key)).first()
        return None if row is None else _entry(row)

    @staticmethod
    def _read_versioned(conn: Connection, key: str) -> tuple[ClaimEntry, int] | None:
        """The entry and its version from ONE statement: read apart, another transaction's
        commit could fall between them (READ COMMITTED) and the CAS would check the wrong one."""
        row = conn.execute(select(claims).where(C.claim_key == key)).first()
        return None if row is None else (_entry(row), int(row.version))

    # --- the port ----------------------------------------------------------------------------

    def read(self, key: str) -> ClaimEntry | None:
        return self._run("read a claim", lambda conn: self._read(conn, key))

    def register(self, session: str, keys: Sequence[str], *, at: datetime) -> None:
        if not keys:
            return

        def work(conn: Connection) -> None:
            S = claim_sessions.c
            try:
                with conn.begin_nested():
                    conn.execute(insert(claim_sessions).values(session_id=session, next_position=0))
            except IntegrityError:
                pass  # the session has a counter already
            # the counter row is this session's lock until commit (SQLite: BEGIN IMMEDIATE)
            nxt = int(
                conn.execute(
                    select(S.next_position).where(S.session_id == session).with_for_update()
                ).scalar_one()
            )
            known = set(
                conn.execute(select(C.claim_key).where(C.claim_key.in_(list(keys)))).scalars()
            )
            new = [k for k in dict.fromkeys(keys) if k not in known]
            if not new:
                return
            conn.execute(
                insert(claims),
                [
                    {
                        "claim_key": k,
                        "session_id": session,
                        "position": nxt + i,
                        "status": ClaimStatus.PENDING.value,
                        "owner": None,
                        "lease_until": None,
                        "attempts": 0,
                        "version": 0,
                        "updated_at": at,
                    }
                    for i, k in enumerate(new)
                ],
            )
            conn.execute(
                update(claim_sessions)
                .where(S.session_id == session)
                .values(next_position=nxt + len(new))
            )

        self._run("register claims", work)

    def claim(
        self, key: str, owner: str, *, lease: timedelta, at: datetime, session: str | None = None
    ) -> Taken:
        until = at + lease

        def create(conn: Connection) -> ClaimEntry | None:
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(claims).values(
                            claim_key=key,
                            session_id=session,
                            position=None,
                            status=ClaimStatus.WORKING.value,
                            owner=owner,
                            lease_until=until,
                            attempts=1,
                            version=0,
                            updated_at=at,
                        )
                    )
            except IntegrityError:
                return None  # 409: someone created it first
            return self._read(conn, key)

        def take(conn: Connection) -> Taken:
            created = create(conn)
            if created is not None:
                return Taken(True, created)
            read = self._read_versioned(conn, key)
            assert read is not None
            current, version = read
            mine = current.status is ClaimStatus.WORKING and current.owner == owner
            free = current.status is ClaimStatus.PENDING or (
                current.status is ClaimStatus.WORKING and not current.live(at)
            )
            if not (mine or free):
                return Taken(False, current)
            done = conn.execute(
                update(claims)
                .where(C.claim_key == key, C.version == version)
                .values(
                    status=ClaimStatus.WORKING.value,
                    owner=owner,
                    lease_until=until,
                    attempts=C.attempts + (0 if mine else 1),
                    version=C.version + 1,
                    updated_at=at,
                )
            )
            now = self._read(conn, key)
            assert now is not None
            return Taken(done.rowcount == 1, now)

        return self._run("claim", take)

    def _move(
        self, action: str, key: str, owner: str, at: datetime, changes: dict[str, Any]
    ) -> ClaimEntry:
        def work(conn: Connection) -> ClaimEntry:
            done = conn.execute(
                update(claims)
                .where(
                    and_(
                        C.claim_key == key,
                        C.status == ClaimStatus.WORKING.value,
                        C.owner == owner,
                    )
                )
                .values(**changes, version=C.version + 1, updated_at=at)
            )
            current = self._read(conn, key)
            if done.rowcount != 1 or current is None:
                state = "unknown" if current is None else f"{current.status} by {current.owner}"
                raise ClaimLostError(
                    f"cannot {action} claim {key!r}: {owner} does not hold it (it is {state})",
                    hint="the lease expired and another consumer took over; settle nothing",
                )
            return current

        return self._run(f"{action} a claim", work)

    def renew(self, key: str, owner: str, *, lease: timedelta, at: datetime) -> ClaimEntry:
        return self._move("renew", key, owner, at, {"lease_until": at + lease})

    def blocker(self, session: str, position: int) -> ClaimEntry | None:
        def work(conn: Connection) -> ClaimEntry | None:
            row = conn.execute(
                select(claims)
                .where(
                    C.session_id == session,
                    C.position < position,
                    C.status.in_([ClaimStatus.PENDING.value, ClaimStatus.WORKING.value]),
                )
                .order_by(C.position)
                .limit(1)
            ).first()
            return None if row is None else _entry(row)

        return self._run("look for an unfinished earlier claim", work)

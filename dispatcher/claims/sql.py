"""The claim log in a SQL database (SQLite or PostgreSQL, SQLAlchemy Core): a claim is an insert
that only one claimer can make (the primary key), every later move is an update guarded by the
row's ``version`` (compare-and-set), and positions come from a per-session counter row that
``register`` locks for its transaction.

The tables (``outbox_claims``, ``outbox_claim_sessions``) are created by ``outbox migrate``
(Alembic revision 0002). Both regions must reach the same database: a PostgreSQL server (or a
SQLite file for tests and a single host). Driver errors leave as ``ClaimLogUnavailableError``
(retryable) or ``ClaimLogError``.

``bounded(timeout)`` is the same log for the sender's write path, every call giving up after
about ``timeout`` seconds (docs/geo.md, ``claim_log_timeout``): its own small pool on the same URL
(waiting at most ``timeout`` for a connection), SQLite's wait for the write lock at ``timeout``
instead of 30 s (``outbox.core.sql.LockWait``), and on PostgreSQL ``lock_timeout``/
``statement_timeout`` at ``timeout`` for each transaction (``set_config(..., true)``, i.e. ``SET
LOCAL``), ``tcp_user_timeout`` at ``timeout`` and a connect timeout of ``max(2 s, timeout)``
(libpq and psycopg never wait less than 2 s for a connection).
Over an engine the caller owns (or an in-memory SQLite database) the view shares that engine and
bounds only the lock waits (SQLite's busy timeout of the connection in use, PostgreSQL's ``SET
LOCAL``).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Row, and_, delete, event, func, insert, select, update
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
#: Claims one ``prune`` transaction deletes at most (a short write lock on SQLite).
PRUNE_CHUNK = 500


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _file_backed(engine: Engine) -> bool:
    """Not an in-memory SQLite database (a second engine on it would be another database)."""
    return not sql.is_sqlite(engine) or engine.url.database not in (None, "", ":memory:")


def _bounded_engine(engine: Engine, timeout: float) -> Engine:
    """A new engine on ``engine``'s URL whose waits end after about ``timeout`` seconds."""
    url = engine.url.render_as_string(hide_password=False)
    if sql.is_sqlite(engine):
        bounded = sql.make_engine(url, pool_timeout=timeout, connect_args={"timeout": timeout})

        @event.listens_for(bounded, "connect")
        def _short_busy_timeout(dbapi_conn: Any, _record: Any) -> None:
            # after make_engine's own pragmas, which set a busy timeout of one attempt (1 s)
            dbapi_conn.execute(f"PRAGMA busy_timeout = {_ms(timeout)}")

        return bounded
    return sql.make_engine(
        url,
        pool_timeout=timeout,
        connect_args={
            "connect_timeout": max(2, math.ceil(timeout)),
            "tcp_user_timeout": _ms(timeout),
        },
    )


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
        #: seconds each call may wait (``bounded``); None: the engine's own waits
        self.timeout: float | None = None
        self._shared_engine_bounded = False  # the SQLite busy timeout is set per connection

    def bounded(self, timeout: float) -> SqlClaimLog:
        """This log with every call giving up after about ``timeout`` seconds (the module says
        how); the sender's write path. Close it when done: it may hold a pool of its own."""
        if timeout <= 0:
            raise ClaimLogError(f"claim log timeout {timeout!r} must be positive")
        own = self._owned and _file_backed(self.engine)
        view = SqlClaimLog(engine=_bounded_engine(self.engine, timeout) if own else self.engine)
        view._owned = own
        view.timeout = timeout
        view._shared_engine_bounded = not own and sql.is_sqlite(self.engine)
        return view

    def close(self) -> None:
        if self._owned:
            self.engine.dispose()

    # --- the edge: transactions with errors translated --------------------------------------

    @contextmanager
    def _tx(self, action: str) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn, self._busy_timeout(conn), conn.begin():
                if self.timeout is not None and self.engine.dialect.name == "postgresql":
                    ms = _ms(self.timeout)
                    conn.exec_driver_sql(
                        f"SELECT set_config('lock_timeout', '{ms}', true), "
                        f"set_config('statement_timeout', '{ms}', true)"
                    )
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

    @contextmanager
    def _busy_timeout(self, conn: Connection) -> Iterator[None]:
        """On a SQLite engine shared with unbounded users: this connection's busy timeout at
        ``timeout`` for the transaction, the engine's own again afterwards."""
        if not self._shared_engine_bounded or self.timeout is None:
            yield
            return
        raw = conn.connection.dbapi_connection
        assert raw is not None
        before = int(raw.execute("PRAGMA busy_timeout").fetchone()[0])
        raw.execute(f"PRAGMA busy_timeout = {_ms(self.timeout)}")
        conn.execution_options(**{sql.LOCK_LIMIT: self.timeout})  # one attempt: the bound
        try:
            yield
        finally:
            try:
                raw.execute(f"PRAGMA busy_timeout = {before}")
            except sqlite3.Error:
                conn.invalidate()  # never hand a connection with the short timeout back

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

    def prune(self, before: datetime, *, limit: int | None = None) -> int:
        """Delete the claims completed or failed before ``before`` (``claim_retention``, from
        ``outbox maintain``), at most ``limit`` (None: all), in chunks of ``PRUNE_CHUNK``, one
        short transaction each; returns how many. A finished entry blocks nothing (``blocker``
        looks for unfinished ones), so only its duplicate check goes: a copy of its message
        arriving later would run again. Pending and working claims and the session counters
        stay. Why a guarded delete per chunk: a claim moved meanwhile is not finished any more."""
        finished = [ClaimStatus.COMPLETED.value, ClaimStatus.FAILED.value]
        done = 0
        while limit is None or done < limit:
            chunk = PRUNE_CHUNK if limit is None else min(PRUNE_CHUNK, limit - done)

            def work(conn: Connection, chunk: int = chunk) -> int:
                old = [C.status.in_(finished), C.updated_at < before]
                keys = list(conn.execute(select(C.claim_key).where(*old).limit(chunk)).scalars())
                if not keys:
                    return 0
                gone = conn.execute(delete(claims).where(C.claim_key.in_(keys), *old))
                return int(gone.rowcount)

            gone = self._run("prune finished claims", work)
            done += gone
            if gone < chunk:
                break
        return done

    def oldest_finished(self) -> tuple[int, datetime | None]:
        """How many claims are completed or failed, and when the oldest of them finished."""
        finished = [ClaimStatus.COMPLETED.value, ClaimStatus.FAILED.value]

        def work(conn: Connection) -> tuple[int, datetime | None]:
            stmt = select(func.count(), func.min(C.updated_at)).where(C.status.in_(finished))
            n, oldest = conn.execute(stmt).one()
            return int(n), None if oldest is None else utc(oldest)

        return self._run("count finished claims", work)

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

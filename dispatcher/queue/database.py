"""The queue's edge with the database: opening engines, transactions, and turning driver errors
into ours (``QueueUnavailableError`` is retryable; a missing schema says to run ``outbox migrate``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from outbox.core import sql
from outbox.core.durations import format_duration
from outbox.core.errors import (
    ClosedError,
    ConfigurationError,
    OutboxError,
    QueueError,
    QueueUnavailableError,
)
from outbox.core.sql import (
    LOCK_WAIT_SINCE,
    MIGRATE_HINT,
    READ_ONLY,
    describe,
    lock_wait_of,
    make_engine,
    parse_url,
)

log = logging.getLogger("outbox.sql")

#: What the queue's database is called in errors and in the lock-wait log lines.
WHAT = "queue database"


def open_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for ``url``; a SQLite file that does not exist yet is an error, not a new file
    (creating an empty database silently would hide a wrong path)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise ConfigurationError(
                "the queue needs a SQLite file, not an in-memory database",
                hint="use sqlite:///path/outbox.db so every process sees the same queue",
            )
        if not Path(db).exists():
            raise QueueError(f"the queue database {db} does not exist", hint=MIGRATE_HINT)
    return make_engine(url, pool_size=pool_size, what=WHAT)


def translate(e: SQLAlchemyError, engine: Engine, action: str) -> OutboxError:
    """Our error for a driver or pool error raised while doing ``action`` on the queue."""
    return sql.translate(e, engine, action, what=WHAT)


_writers: dict[str, threading.Lock] = {}
_writers_guard = threading.Lock()


def _sqlite_writer(engine: Engine) -> _WriterMutex:
    key = str(Path(engine.url.database or "").resolve())
    with _writers_guard:
        return _WriterMutex(_writers.setdefault(key, threading.Lock()), engine)


class _WaitedTooLong(Exception):
    def __init__(self, waited: float) -> None:
        self.waited = waited


class _WriterMutex:
    """The in-process writer mutex of a SQLite file (one lock, shared by every ``Database`` on the
    file), waited for like SQLite's own lock: logged every ``LockWait.log_every`` seconds and
    given up after the engine's limit (``_WaitedTooLong``). A thread of this process can hold it
    for long: a Consumer handler that takes a Connection runs inside the write transaction."""

    def __init__(self, lock: threading.Lock, engine: Engine) -> None:
        self._lock = lock
        self._engine = engine

    def __enter__(self) -> float | None:
        """None when the lock was free, else the clock's reading when the wait began."""
        if self._lock.acquire(blocking=False):
            return None
        wait, limit = lock_wait_of(self._engine)
        since, logged = wait.clock(), 0
        while True:
            waited = wait.clock() - since
            if waited >= limit:
                raise _WaitedTooLong(waited)
            due = int(waited // wait.log_every) if wait.log_every > 0 else 0
            if due > logged:
                logged = due
                log.warning(
                    "waiting for the %s's write lock, held by another thread of this process: "
                    "%s so far (%s)",
                    WHAT,
                    format_duration(due * wait.log_every),
                    describe(self._engine),
                )
            if self._lock.acquire(timeout=max(wait.attempt, 0.001)):
                return since

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()


_local = threading.local()


def _open_writes() -> set[str]:
    """The databases this thread has a write transaction open on."""
    held: set[str] | None = getattr(_local, "writes", None)
    if held is None:
        held = _local.writes = set()
    return held


class Database:
    """An engine plus the two kinds of transaction the queue uses, with errors translated."""

    def __init__(self, engine: Engine, *, owned: bool) -> None:
        self.engine = engine
        self.owned = owned
        self.closed = False
        self.postgres = engine.dialect.name == "postgresql"
        # SQLite has one writer at a time, and a blocked writer polls with sleeps of up to 100 ms
        # (the busy handler). Threads of this process queue on a mutex instead, which hands the
        # write lock over at once; other processes still meet the busy handler.
        self._writer = _sqlite_writer(engine) if not self.postgres else None
        self._key = describe(engine)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the queue was closed", hint="create a new SqlQueue")

    def _nested(self, action: str) -> QueueError:
        return QueueError(
            f"cannot {action}: this thread is already inside a write transaction on "
            f"{describe(self.engine)} (a Consumer handler that takes a Connection runs in "
            "one); a second transaction would wait for the first forever",
            hint="pass the handler's connection, e.g. queue.send(name, message, conn=conn), "
            "so the work joins its transaction",
        )

    @contextmanager
    def write(self, action: str, conn: Connection | None = None) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite), committed on exit.

        With ``conn``, the work joins that connection's transaction instead (the caller commits).
        A second write transaction opened by a thread already inside one on the same database is
        refused: on SQLite it would wait forever for the write lock its own thread holds.
        """
        self._check_open()
        if conn is not None:
            try:
                yield conn
            except SQLAlchemyError as e:
                raise translate(e, self.engine, action) from e
            return
        held = _open_writes()
        if self._key in held:
            raise self._nested(action)
        held.add(self._key)
        try:
            if self._writer is None:
                with self.engine.begin() as c:
                    yield c
            else:
                with self._writer as since, self.engine.connect() as c:
                    if since is not None:  # the wait for the mutex counts towards SQLite's
                        c.execution_options(**{LOCK_WAIT_SINCE: since})
                    with c.begin():
                        yield c
        except _WaitedTooLong as e:
            raise QueueUnavailableError(
                f"cannot {action}: the {WHAT} {self._key} is locked by another thread of this "
                f"process (waited {format_duration(e.waited)} for its write lock); the operation "
                "did not complete and nothing was lost",
                hint="a write transaction of this process runs long (a Consumer handler that "
                "takes a Connection runs inside one): keep it short, then retry",
            ) from None
        except SQLAlchemyError as e:
            raise translate(e, self.engine, action) from e
        finally:
            held.discard(self._key)

    @contextmanager
    def statement(self, action: str) -> Iterator[Connection]:
        """A connection for one writing statement that is its own transaction.

        On PostgreSQL it runs in autocommit: the statement is atomic and durable on return, and
        saves the BEGIN and COMMIT round trips (a settlement is then two round trips, not four).
        SQLite has no round trips to save, so it is a ``write`` there.
        """
        if not self.postgres:
            with self.write(action) as c:
                yield c
            return
        self._check_open()
        if self._key in _open_writes():  # it could wait for a row that transaction holds
            raise self._nested(action)
        try:
            with self.engine.connect() as c:
                yield c.execution_options(isolation_level="AUTOCOMMIT")
        except SQLAlchemyError as e:
            raise translate(e, self.engine, action) from e

    @contextmanager
    def read(self, action: str) -> Iterator[Connection]:
        """A read-only transaction (deferred BEGIN on SQLite: it never waits for the writer)."""
        self._check_open()
        try:
            with self.engine.connect() as conn:
                conn.execution_options(**READ_ONLY)
                with conn.begin():
                    yield conn
        except SQLAlchemyError as e:
            raise translate(e, self.engine, action) from e

    def close(self) -> None:
        if not self.closed and self.owned:
            self.engine.dispose()
        self.closed = True

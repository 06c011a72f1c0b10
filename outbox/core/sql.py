"""SQLAlchemy engines for the queue, checkpoints and inbox, with driver errors translated.

SQLite runs in WAL mode with a busy timeout, so readers never block the writer and short write
transactions queue up instead of failing. PostgreSQL needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from outbox.core.errors import (
    ConfigurationError,
    MissingDependencyError,
    OutboxError,
    QueueError,
    QueueUnavailableError,
)

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a PostgreSQL connection attempt may take before it fails (retryably) instead of hanging.
PG_CONNECT_TIMEOUT_S = 10
MIGRATE_HINT = "run `outbox migrate` to create the tables"
_MISSING_TABLE_CODES = {"42P01"}  # PostgreSQL undefined_table
# insufficient_privilege, and class 28: invalid authorization (wrong password, no such role)
_DENIED_CODES = {"42501"}
_SQLITE_DENIED = ("readonly database", "permission denied", "access permission denied")


def parse_url(url: str) -> URL:
    """``url`` parsed, or a ``ConfigurationError`` that shows the accepted forms."""
    try:
        return make_url(url)
    except ArgumentError as e:
        raise ConfigurationError(
            f"sql_url {url!r} is not a database URL",
            hint="use sqlite:///path/outbox.db or postgresql+psycopg://user@host/db",
        ) from e


def make_engine(url: str, *, pool_size: int | None = None, **kwargs: Any) -> Engine:
    """An engine for ``url`` (``sqlite:///...`` or ``postgresql+psycopg://...``).

    ``pool_size``: connections kept open; size it to the threads that use the engine at once
    (a worker's receivers and lock renewers plus the dispatcher's concurrent sends), or they wait
    for a connection and finally fail with ``QueueUnavailableError``.
    """
    parsed = parse_url(url)
    if pool_size is not None:
        if pool_size < 1:
            raise ConfigurationError(f"pool_size {pool_size!r} must be at least 1")
        kwargs.setdefault("pool_size", pool_size)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            parent = Path(db).parent
            if not parent.exists():
                raise ConfigurationError(
                    f"the folder {parent} for the SQLite database does not exist",
                    hint="run `outbox migrate` to create the workspace, or fix sql_url",
                )
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, **kwargs.pop("connect_args", {})}
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        try:
            connect_args = {
                "connect_timeout": PG_CONNECT_TIMEOUT_S,
                **kwargs.pop("connect_args", {}),
            }
            engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        except (NoSuchModuleError, ModuleNotFoundError) as e:
            raise MissingDependencyError(
                "PostgreSQL support is not installed",
                hint="pip install 'delta-outbox[postgres]'",
            ) from e
        ping_when_idle(engine)
        return engine
    raise ConfigurationError(
        f"sql_url uses {backend!r}, which is not supported",
        hint="use sqlite:///path/outbox.db or postgresql+psycopg://user@host/db",
    )


#: A pooled PostgreSQL connection idle at least this long is pinged before use (seconds).
PING_AFTER_IDLE_S = 0.1


def ping_when_idle(
    engine: Engine, idle: float = PING_AFTER_IDLE_S, clock: Callable[[], float] = time.monotonic
) -> None:
    """Ping a pooled connection on checkout only when it sat idle ``idle`` seconds or more.

    Why not ``pool_pre_ping``: it pings on every checkout, a round trip that was about a third
    of a receive+complete's client CPU on PostgreSQL (docs/performance-queue.md), while a
    connection a busy receiver checked in a millisecond ago is as alive as a ping could show. A
    connection that waited (the server may have restarted meanwhile) is still pinged, and one that
    fails the ping is replaced, as with ``pool_pre_ping``. A server that drops a connection inside
    the window fails that one operation with the retryable ``QueueUnavailableError``, and
    SQLAlchemy then replaces every pooled connection.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["outbox_idle_since"] = clock()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("outbox_idle_since")
        if since is None or clock() - since < idle:
            return  # new (just connected), or in use a moment ago
        try:
            if not engine.dialect.do_ping(dbapi_conn):
                raise DisconnectionError("the pooled connection failed its ping")
        except DisconnectionError:
            raise
        except Exception as e:
            # the pool discards this connection and checks out another (a new one if need be)
            raise DisconnectionError(f"the pooled connection failed its ping: {e}") from e


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE, so a read-then-write transaction
    # takes the write lock up front instead of failing with SQLITE_BUSY on upgrade.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit is on disk when it returns, so "send returned" means durable even across a
    # power cut (NORMAL in WAL mode only survives an application crash).
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


#: Execution option for work that only reads: on SQLite it starts a deferred ``BEGIN`` so readers
#: (peek, stats, the CLI) never wait behind, or hold up, the single writer.
READ_ONLY = {"outbox_read_only": True}


def _sqlite_begin_immediate(conn: Any) -> None:
    if conn.get_execution_options().get("outbox_read_only"):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def describe(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def redact_url(url: str) -> str:
    """``url`` with its password hidden, for anything printed or logged."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # settings validated the URL already; never fail a report over it
        return url


def _first_line(e: BaseException) -> str:
    orig = e.orig if isinstance(e, DBAPIError) and e.orig is not None else e
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _sqlstate(e: DBAPIError) -> str:
    return str(getattr(e.orig, "sqlstate", None) or "")


def translate(
    e: SQLAlchemyError, engine: Engine, action: str, *, what: str = "SQL database"
) -> OutboxError:
    """Our error for a SQLAlchemy error raised while doing ``action`` on ``engine``.

    Only a database that cannot be reached *right now* (connection refused or dropped, busy,
    the pool exhausted) is ``QueueUnavailableError``, the retryable one. Missing tables, denied
    permissions and anything else are ``QueueError``: retrying will not help, an operator must.
    """
    where = describe(engine)
    if isinstance(e, DBAPIError):
        code, text = _sqlstate(e), _first_line(e)
        if code in _MISSING_TABLE_CODES or "no such table" in text:
            return QueueError(
                f"cannot {action}: the {what} {where} has no outbox tables ({text})",
                hint=MIGRATE_HINT,
            )
        if (
            code in _DENIED_CODES
            or code.startswith("28")
            or any(d in text.lower() for d in _SQLITE_DENIED)
        ):
            return QueueError(
                f"cannot {action}: the {what} {where} refused access ({text})",
                hint="check the user's privileges (or the file's permissions) and the password",
            )
        if not (isinstance(e, OperationalError | InterfaceError) or e.connection_invalidated):
            return QueueError(f"cannot {action} on the {what} {where}: {text}")
    elif not isinstance(e, PoolTimeoutError | DisconnectionError):
        return QueueError(f"cannot {action} on the {what} {where}: {type(e).__name__}: {e}")
    return QueueUnavailableError(
        f"cannot {action}: the {what} {where} is unreachable or busy ({_first_line(e)}); the "
        "operation did not complete and nothing was lost",
        hint="check the database is up (and the connection pool is big enough), then retry; "
        "sends are deduplicated by message_id",
    )

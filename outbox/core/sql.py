"""SQLAlchemy engines for the queue, checkpoints and inbox, with driver errors translated.

SQLite runs in WAL mode, so readers never block the writer, and a writer's wait for the write
lock is bounded and logged (``outbox.core.sqlite``). A ``read_only_url`` (``?mode=ro``) opens
SQLite read-only: never creating the file, never taking the write lock, and working on a
read-only file system (``outbox status``). PostgreSQL needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

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

from outbox.core.durations import format_duration
from outbox.core.errors import (
    ConfigurationError,
    MissingDependencyError,
    OutboxError,
    QueueError,
    QueueUnavailableError,
)
from outbox.core.sqlite import (
    LOCK_LIMIT,
    LOCK_WAIT_SINCE,
    READ_ONLY,
    SQLITE_BUSY,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_LOCKED,
    LockWait,
    install,
    is_locked,
    sqlite_code,
)

#: The SQLite names are ``outbox.core.sqlite``'s, here too so one import serves an adapter.
__all__ = [
    "LOCK_LIMIT",
    "LOCK_WAIT",
    "LOCK_WAIT_SINCE",
    "MIGRATE_HINT",
    "PG_CONNECT_TIMEOUT_S",
    "PING_AFTER_IDLE_S",
    "READ_ONLY",
    "SQLITE_BUSY_TIMEOUT_MS",
    "LockWait",
    "describe",
    "explain",
    "is_locked",
    "is_sqlite",
    "lock_wait_of",
    "make_engine",
    "parse_url",
    "ping_when_idle",
    "read_only_url",
    "redact_url",
    "translate",
]

#: Seconds a PostgreSQL connection attempt may take before it fails (retryably) instead of hanging.
PG_CONNECT_TIMEOUT_S = 10
MIGRATE_HINT = "run `outbox migrate` to create the tables"
_MISSING_TABLE_CODES = {"42P01"}  # PostgreSQL undefined_table
# insufficient_privilege, and class 28: invalid authorization (wrong password, no such role)
_DENIED_CODES = {"42501"}
_SQLITE_DENIED = ("readonly database", "permission denied", "access permission denied")
#: SQLite's primary result codes that say what is wrong with the file, not with the connection.
_SQLITE_READONLY = 8
_SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 13, 14
#: PostgreSQL: disk_full, read_only_sql_transaction, lock_not_available.
_PG_FULL, _PG_READ_ONLY, _PG_LOCKED = {"53100"}, {"25006"}, {"55P03"}
#: The query parameter of ``read_only_url`` (taken out before the driver sees the URL).
_READ_ONLY_PARAM = "mode"


#: The waits of engines made without ``lock_wait=`` (a test may replace it before making them).
LOCK_WAIT = LockWait()


def parse_url(url: str) -> URL:
    """``url`` parsed, or a ``ConfigurationError`` that shows the accepted forms."""
    try:
        return make_url(url)
    except ArgumentError as e:
        raise ConfigurationError(
            f"sql_url {url!r} is not a database URL",
            hint="use sqlite:///path/outbox.db or postgresql+psycopg://user@host/db",
        ) from e


def read_only_url(url: str) -> str:
    """``url`` opened read-only: a SQLite URL gets ``?mode=ro`` (see ``make_engine``); any other
    URL is returned as it is (a PostgreSQL read takes no lock a writer waits for)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return url
    return parsed.update_query_dict({_READ_ONLY_PARAM: "ro"}).render_as_string(hide_password=False)


def make_engine(
    url: str,
    *,
    pool_size: int | None = None,
    what: str = "SQL database",
    lock_wait: LockWait | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url`` (``sqlite:///...`` or ``postgresql+psycopg://...``).

    ``pool_size``: connections kept open; size it to the threads that use the engine at once
    (a worker's receivers and lock renewers plus the dispatcher's concurrent sends), or they wait
    for a connection and finally fail with ``QueueUnavailableError``.

    SQLite: ``what`` names the database in the lock-wait log lines; ``lock_wait`` (default
    ``LOCK_WAIT``) bounds a writer's wait, or ``connect_args={"timeout": seconds}`` does.
    ``?mode=ro`` (``read_only_url``) opens the file read-only; it must exist.
    """
    parsed = parse_url(url)
    if pool_size is not None:
        if pool_size < 1:
            raise ConfigurationError(f"pool_size {pool_size!r} must be at least 1")
        kwargs.setdefault("pool_size", pool_size)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, what, lock_wait or LOCK_WAIT, **kwargs)
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


def _sqlite_engine(parsed: URL, what: str, wait: LockWait, **kwargs: Any) -> Engine:
    read_only = parsed.query.get(_READ_ONLY_PARAM) == "ro"
    if read_only:
        parsed = parsed.difference_update_query([_READ_ONLY_PARAM])
    db = parsed.database
    if db and db != ":memory:":
        path = Path(db)
        if read_only and not path.is_file():
            raise ConfigurationError(
                f"the SQLite database {db} does not exist",
                hint="run `outbox migrate` to create the workspace, or fix sql_url",
            )
        if not path.parent.exists():
            raise ConfigurationError(
                f"the folder {path.parent} for the SQLite database does not exist",
                hint="run `outbox migrate` to create the workspace, or fix sql_url",
            )
    connect_args = dict(kwargs.pop("connect_args", {}))
    # A caller's own driver timeout (the claim log's bounded view) is the whole wait's limit.
    limit = float(connect_args.pop("timeout", wait.limit))
    connect_args["timeout"] = min(wait.attempt, limit)
    engine = create_engine(parsed, connect_args=connect_args, **kwargs)
    install(engine, db=db, read_only=read_only, wait=wait, limit=limit, what=what)
    _lock_waits[engine] = (wait, limit)
    return engine


_lock_waits: WeakKeyDictionary[Engine, tuple[LockWait, float]] = WeakKeyDictionary()


def lock_wait_of(engine: Engine) -> tuple[LockWait, float]:
    """The ``LockWait`` and the limit in seconds of a SQLite engine's writers (``LOCK_WAIT``
    for an engine ``make_engine`` did not make)."""
    return _lock_waits.get(engine, (LOCK_WAIT, LOCK_WAIT.limit))


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


#: (kind, SQLite primary codes, PostgreSQL SQLSTATEs) of the problems ``explain`` knows.
_FILE_PROBLEMS: tuple[tuple[str, set[int], set[str]], ...] = (
    ("locked", {SQLITE_BUSY, SQLITE_LOCKED}, _PG_LOCKED),
    ("full", {_SQLITE_FULL}, _PG_FULL),
    ("read-only", {_SQLITE_READONLY}, _PG_READ_ONLY),
    ("cannot open", {_SQLITE_CANTOPEN}, set[str]()),
    ("disk failed", {_SQLITE_IOERR}, set[str]()),
)


def explain(e: BaseException, what: str, where: str) -> tuple[str, str, bool] | None:
    """(problem, fix, retryable) for a database error whose cause lies in the file or the disk
    (locked by another process, full, read-only, cannot be opened) rather than the connection;
    None otherwise. Shared by every adapter's translation, so a full disk is never reported as
    an unreachable server."""
    if not isinstance(e, DBAPIError):
        return None
    code, state, text = sqlite_code(e), _sqlstate(e), _first_line(e)
    kind = next((k for k, codes, states in _FILE_PROBLEMS if code in codes or state in states), "")
    file = _file_of(where)
    if kind == "locked":
        waited = getattr(e, "outbox_waited", None)
        held = f"; waited {format_duration(waited)} for its write lock" if waited else ""
        holder = (
            f"the process that holds it (`fuser {file}` shows it): a long transaction, or a "
            "sqlite3 shell left in BEGIN"
            if file
            else "the session that holds the lock (pg_locks and pg_stat_activity show it)"
        )
        return (
            f"the {what} {where} is locked by another process ({text}{held})",
            f"find {holder}; let it finish or stop it, then retry",
            True,
        )
    beside = f" (SQLite also writes {file}-wal and {file}-shm beside it)" if file else ""
    known = {
        "full": (
            f"the disk holding the {what} {where} is full ({text})",
            "free space on that disk (or move the database to a larger one), then retry",
            True,
        ),
        "read-only": (
            f"the {what} {where} is read-only ({text})",
            f"let the user running outbox write the file and its folder{beside}, or point "
            "sql_url at a writable copy",
            False,
        ),
        "cannot open": (
            f"cannot open the {what} {where} ({text})",
            f"check that {file or 'the file'} exists and that this user can read it and write "
            "its folder (SQLite keeps its -wal and -shm files there); `outbox migrate` creates it",
            True,
        ),
        "disk failed": (
            f"the disk holding the {what} {where} failed a read or write ({text})",
            "check that disk: full, failing, or a network file system SQLite cannot lock (keep "
            "the database on a local disk), then retry",
            True,
        ),
    }
    return known.get(kind)


def _file_of(where: str) -> str | None:
    """The file of a SQLite URL as ``describe`` renders it (None for a server database)."""
    try:
        parsed = make_url(where)
    except ArgumentError:
        return None
    db = parsed.database
    return db if parsed.get_backend_name() == "sqlite" and db and db != ":memory:" else None


def translate(
    e: SQLAlchemyError, engine: Engine, action: str, *, what: str = "SQL database"
) -> OutboxError:
    """Our error for a SQLAlchemy error raised while doing ``action`` on ``engine``.

    A database that cannot be reached *right now* (connection refused or dropped, the pool
    exhausted) is ``QueueUnavailableError``, the retryable one, and so are a locked file and a
    full disk, each with its own fix (``explain``). Missing tables, denied permissions, a
    read-only file and anything else are ``QueueError``: retrying will not help, an operator must.
    """
    where = describe(engine)
    if isinstance(e, DBAPIError):
        code, text = _sqlstate(e), _first_line(e)
        if code in _MISSING_TABLE_CODES or "no such table" in text:
            return QueueError(
                f"cannot {action}: the {what} {where} has no outbox tables ({text})",
                hint=MIGRATE_HINT,
            )
        known = explain(e, what, where)
        if known is not None:
            problem, fix, retryable = known
            kind = QueueUnavailableError if retryable else QueueError
            nothing_lost = "; the operation did not complete and nothing was lost"
            return kind(f"cannot {action}: {problem}{nothing_lost}", hint=fix)
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

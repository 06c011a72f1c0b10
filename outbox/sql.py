"""SQLAlchemy engines for the queue, checkpoints and inbox, with driver errors translated.

SQLite runs in WAL mode with a busy timeout, so readers never block the writer and short write
transactions queue up instead of failing. PostgreSQL needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from outbox.errors import ConfigurationError, MissingDependencyError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def parse_url(url: str) -> URL:
    """``url`` parsed, or a ``ConfigurationError`` that shows the accepted forms."""
    try:
        return make_url(url)
    except ArgumentError as e:
        raise ConfigurationError(
            f"sql_url {url!r} is not a database URL",
            hint="use sqlite:///path/outbox.db or postgresql+psycopg://user@host/db",
        ) from e


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` (``sqlite:///...`` or ``postgresql+psycopg://...``)."""
    parsed = parse_url(url)
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
        engine = create_engine(
            parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        try:
            return create_engine(parsed, pool_pre_ping=True, **kwargs)
        except (NoSuchModuleError, ModuleNotFoundError) as e:
            raise MissingDependencyError(
                "PostgreSQL support is not installed",
                hint="pip install 'delta-outbox[postgres]'",
            ) from e
    raise ConfigurationError(
        f"sql_url uses {backend!r}, which is not supported",
        hint="use sqlite:///path/outbox.db or postgresql+psycopg://user@host/db",
    )


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

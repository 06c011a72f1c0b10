"""Programmatic Alembic for the SQL schema: ``upgrade(url)`` brings a database to the newest
revision and says what it did; ``current_revision(engine)`` reads where it stands.

A new database (no version table) is not taken through every revision: its tables are created
from ``migrations.sql.tables`` and the version table stamped at the head, in one transaction
(Alembic's cookbook, "Building an Up to Date Database from Scratch"): every revision in turn
cost each new workspace about half a second. ``tests/queue/test_fresh_schema.py`` checks both
paths give the same database, on SQLite and PostgreSQL. A database with a version table is
upgraded revision by revision.

No alembic.ini is needed at run time: the Config is built here with ``script_location`` pointing at
this package, and Alembic runs on our own engine (so SQLite gets WAL and the busy timeout).

Alembic is imported only to change a schema: checking a database's revision, which every queue
opened does (``SqlQueue``), reads the version table with SQLAlchemy against ``HEAD``. Importing
Alembic and reading its revision files cost each process about 0.3 s of CPU.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from migrations.sql.tables import metadata
from outbox.core.errors import QueueError
from outbox.core.sql import READ_ONLY, describe, translate

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

HERE = Path(__file__).resolve().parent
VERSION_TABLE = "outbox_sql_version"
#: The newest revision this version of the code knows: the head of ``versions/``, which a test
#: checks it is (a new revision moves it).
HEAD = "0014_rescues"
#: ``Config.attributes`` key: the revision ``upgrade`` started from (None: a new database). A
#: revision that must tell a database with a history from a new one reads it (0007).
UPGRADING_FROM = "outbox_upgrading_from"
#: PostgreSQL's advisory lock around every schema change (``env.py`` and the fresh path): two
#: processes migrating at once would both try CREATE TABLE.
PG_LOCK = 7262341


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Alembic logs at INFO on every context it opens ("Context impl SQLiteImpl.", "Running
    upgrade ..."); inside ``Outbox.open`` that lands in the application's own log. Quiet it unless
    the application gave the ``alembic`` logger a level of its own (then it wants them)."""
    logger = logging.getLogger("alembic")
    if logger.level != logging.NOTSET:
        yield
        return
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(logging.NOTSET)


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    """The revisions, read once per process (reading them imports every revision file)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """The newest revision this version of the code knows."""
    return HEAD


def _engine(engine_or_url: Engine | str) -> tuple[Engine, bool]:
    if isinstance(engine_or_url, Engine):
        return engine_or_url, False
    from outbox.core.sql import make_engine

    return make_engine(engine_or_url), True


def current_revision(engine_or_url: Engine | str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine, owned = _engine(engine_or_url)
    try:
        # Read-only: on SQLite a deferred BEGIN, so opening a queue (which checks the revision)
        # never waits for, or holds up, the single writer.
        with engine.connect().execution_options(**READ_ONLY) as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            found = list(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    except SQLAlchemyError as e:
        raise translate(e, engine, "read the schema revision") from e
    finally:
        if owned:
            engine.dispose()
    if len(found) > 1:  # branches, which this history never has (Alembic refuses them too)
        raise QueueError(
            f"the SQL database {describe(engine)} is at {len(found)} schema revisions at once "
            f"({', '.join(sorted(found))}); outbox migrations have one line of revisions",
            hint=f"leave one row in {VERSION_TABLE}, the revision the tables are at",
        )
    return str(found[0]) if found else None


def upgrade(engine_or_url: Engine | str) -> list[str]:
    """Migrate to the newest revision; returns what was done, a line each (empty when up to
    date): the revisions applied, or for a new database the one step that created it.

    Safe to run twice and from two processes at once (PostgreSQL takes an advisory lock; SQLite's
    BEGIN IMMEDIATE serializes the writers).
    """
    engine, owned = _engine(engine_or_url)
    try:
        before = current_revision(engine)
        if before == head_revision():
            return []
        if before is None:
            created = _create_at_head(engine)
            if created:
                return created
        return _upgrade_by_revisions(engine)
    except SQLAlchemyError as e:
        raise translate(e, engine, "migrate the schema") from e
    finally:
        if owned:
            engine.dispose()


def _create_at_head(engine: Engine) -> list[str]:
    """Create a new database's tables at the head revision in one transaction; empty (nothing
    done) when the database has a version table, which the revisions then bring up to date.

    The check is made under the lock every migration takes (SQLite's BEGIN IMMEDIATE, which
    ``outbox.core.sqlite`` issues for a writing transaction; PostgreSQL's advisory lock), so of
    two processes opening one new database, one creates it and the other finds it done. A
    database holding the outbox's tables without a version table fails on the first CREATE
    TABLE (no ``checkfirst``): stamping tables nobody checked would hide that.
    """
    with engine.connect() as conn, _quiet_alembic(), conn.begin():
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_LOCK})")
        if inspect(conn).has_table(VERSION_TABLE):
            return []
        metadata.create_all(conn, checkfirst=False)
        _stamp_head(conn)
    return [
        f"sql schema: created at {head_revision()} (a new database: the newest schema at once, "
        "not revision by revision)"
    ]


def _stamp_head(conn: Connection) -> None:
    """Write ``HEAD`` in the version table, creating it (what ``alembic stamp head`` does, on
    our connection and in our transaction, without running ``env.py`` each time)."""
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    ctx.stamp(_script(), head_revision())


def _upgrade_by_revisions(engine: Engine) -> list[str]:
    """Run every revision after the database's own, in turn (the applied ones, in words)."""
    from alembic import command

    before = current_revision(engine)  # again: another process may have migrated meanwhile
    if before == head_revision():
        return []
    cfg = _config()
    with engine.connect() as conn, _quiet_alembic():
        cfg.attributes["connection"] = conn
        cfg.attributes[UPGRADING_FROM] = before
        command.upgrade(cfg, "head")
        conn.commit()
    after = current_revision(engine)
    # Each revision's first paragraph (alembic's ``doc``), on one line: the operator reads
    # what changed, in words for the operator (no issue numbers: they mean nothing there).
    return [
        f"sql schema: applied {rev.revision} ({' '.join((rev.doc or '').split())})"
        for rev in reversed(list(_script().iterate_revisions(after, before)))
    ]

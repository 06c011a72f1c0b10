"""Programmatic Alembic for the SQL schema: ``upgrade(url)`` brings a database to the newest
revision and says what it did; ``current_revision(engine)`` reads where it stands.

No alembic.ini is needed at run time: the Config is built here with ``script_location`` pointing at
this package, and Alembic runs on our own engine (so SQLite gets WAL and the busy timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import SQLAlchemyError

from outbox.core.sql import READ_ONLY, translate

HERE = Path(__file__).resolve().parent
VERSION_TABLE = "outbox_sql_version"
#: ``Config.attributes`` key: the revision ``upgrade`` started from (None: a new database). A
#: revision that must tell a database with a history from a new one reads it (0007).
UPGRADING_FROM = "outbox_upgrading_from"


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
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return cfg


def head_revision() -> str:
    """The newest revision this version of the code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


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
        with engine.connect().execution_options(**READ_ONLY) as conn, _quiet_alembic():
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    except SQLAlchemyError as e:
        raise translate(e, engine, "read the schema revision") from e
    finally:
        if owned:
            engine.dispose()


def upgrade(engine_or_url: Engine | str) -> list[str]:
    """Migrate to the newest revision; returns the revisions applied (empty when up to date).

    Safe to run twice and from two processes at once (PostgreSQL takes an advisory lock; SQLite's
    BEGIN IMMEDIATE serializes the writers).
    """
    engine, owned = _engine(engine_or_url)
    try:
        before = current_revision(engine)
        if before == head_revision():
            return []
        cfg = _config()
        with engine.connect() as conn, _quiet_alembic():
            cfg.attributes["connection"] = conn
            cfg.attributes[UPGRADING_FROM] = before
            command.upgrade(cfg, "head")
            conn.commit()
        after = current_revision(engine)
        script = ScriptDirectory.from_config(cfg)
        # Each revision's first paragraph (alembic's ``doc``), on one line: the operator reads
        # what changed, in words for the operator (no issue numbers: they mean nothing there).
        applied = [
            f"sql schema: applied {rev.revision} ({' '.join((rev.doc or '').split())})"
            for rev in reversed(list(script.iterate_revisions(after, before)))
        ]
        return applied
    except SQLAlchemyError as e:
        raise translate(e, engine, "migrate the schema") from e
    finally:
        if owned:
            engine.dispose()

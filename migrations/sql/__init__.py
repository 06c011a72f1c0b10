"""Programmatic Alembic for the SQL schema: ``upgrade(url)`` brings a database to the newest
revision and says what it did; ``current_revision(engine)`` reads where it stands.

No alembic.ini is needed at run time: the Config is built here with ``script_location`` pointing at
this package, and Alembic runs on our own engine (so SQLite gets WAL and the busy timeout).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import DBAPIError

from outbox.errors import QueueUnavailableError

HERE = Path(__file__).resolve().parent
VERSION_TABLE = "outbox_sql_version"


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
    from outbox.sql import make_engine

    return make_engine(engine_or_url), True


def current_revision(engine_or_url: Engine | str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine, owned = _engine(engine_or_url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(VERSION_TABLE):
                return None
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    except DBAPIError as e:
        raise _unreachable(engine, e) from e
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
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        after = current_revision(engine)
        script = ScriptDirectory.from_config(cfg)
        applied = [
            f"sql schema: applied {rev.revision} ({(rev.doc or '').strip().splitlines()[0]})"
            for rev in reversed(list(script.iterate_revisions(after, before)))
        ]
        return applied
    except DBAPIError as e:
        raise _unreachable(engine, e) from e
    finally:
        if owned:
            engine.dispose()


def _unreachable(engine: Engine, e: DBAPIError) -> QueueUnavailableError:
    return QueueUnavailableError(
        f"the SQL database {engine.url.render_as_string(hide_password=True)} is unreachable: "
        f"{str(e.orig).strip().splitlines()[0] if e.orig else e}",
        hint="check that the database server is running and the URL is right, then retry",
    )

"""Built once, copied per test: a workspace migrated by ``outbox migrate`` (its Delta table and
its SQL schema), for fixtures whose tests each need a fresh one but not a fresh migration.
Migrating costs a test most of its set-up (the Delta table, every Alembic revision); a copy is
a folder copy and, for the database, SQLite's backup API or PostgreSQL's ``CREATE DATABASE ...
TEMPLATE``. The copy is what the migration made, so a test of the migration itself migrates.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.pg import PostgresServer

#: Migrates the workspace at the path whose ``outbox.toml`` names the SQL URL.
Migrate = Callable[[Path], None]


def _settings(ws: Path, sql_url: str) -> None:
    (ws / "outbox.toml").write_text(f'sql_url = "{sql_url}"\n')


class MigratedTemplates:
    """One migrated workspace per kind of database (SQLite, PostgreSQL), built on first use in
    ``root``; ``workspace`` makes a test's own from it."""

    def __init__(self, root: Path, migrate: Migrate):
        self.root = root
        self.migrate = migrate
        self.pg_server: PostgresServer | None = None
        self._built: dict[str, Path] = {}

    def workspace(self, ws: Path, sql_url: str, pg_server: PostgresServer | str | None) -> None:
        """A migrated workspace at ``ws`` (not there yet) whose settings name ``sql_url`` (a
        fresh, empty database: the ``sql_url`` fixture's), its database migrated too.
        ``pg_server``, for a PostgreSQL URL: the suite's throwaway server (``tests.pg``); with
        an external one (a URL: ``OUTBOX_TEST_PG_URL``) the workspace is migrated in place,
        never copied (that database is not ours to drop)."""
        kind = make_url(sql_url).get_backend_name()
        if kind == "postgresql":
            if not isinstance(pg_server, PostgresServer):
                pg_server = None
            elif self.pg_server is None:
                self.pg_server = pg_server
        if kind == "postgresql" and pg_server is None:
            ws.mkdir()
            _settings(ws, sql_url)
            self.migrate(ws)
            return
        template = self._built.get(kind) or self._build(kind)
        shutil.copytree(template, ws)
        _settings(ws, sql_url)
        if kind == "sqlite":
            _copy_sqlite(self._sqlite_path(template), make_url(sql_url).database or "")
        else:
            self._copy_postgres(sql_url)

    def _sqlite_path(self, template: Path) -> str:
        return str(template.parent / "outbox.db")

    def _template_db(self) -> str:
        return f"template_{id(self):x}"

    def _build(self, kind: str) -> Path:
        where = self.root / kind
        ws = where / "ws"
        ws.mkdir(parents=True)
        if kind == "sqlite":
            url = f"sqlite:///{self._sqlite_path(ws)}"
        else:
            assert isinstance(self.pg_server, PostgresServer)
            url = self.pg_server.create_database(self._template_db())
        _settings(ws, url)
        self.migrate(ws)
        (ws / "outbox.toml").unlink()  # each copy names its own database
        self._built[kind] = ws
        return ws

    def _copy_postgres(self, sql_url: str) -> None:
        """The test's database (created empty by ``pg_url``) made again as a copy of the
        migrated one: nothing else is connected to either."""
        import psycopg

        assert isinstance(self.pg_server, PostgresServer)
        name = make_url(sql_url).database
        with psycopg.connect(
            f"host=127.0.0.1 port={self.pg_server.port} user=outbox dbname=postgres",
            autocommit=True,
        ) as c:
            c.execute(f'DROP DATABASE "{name}"')
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template_db()}"')


def _copy_sqlite(source: str, target: str) -> None:
    """SQLite's online backup: a consistent copy whatever journal mode the database is in."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()

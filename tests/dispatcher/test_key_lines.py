"""The shipped key-lines contract on each store: this process's memory, and the SQL queue's
database (a SQLite file, a real PostgreSQL server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from dispatcher.queue.database import Database, open_engine
from dispatcher.queue.key_lines import KeyLines, MemoryKeyLines, SqlKeyLines
from migrations.sql import upgrade
from migrations.sql.tables import key_holds
from outbox.testing.contracts.key_lines import KeyLinesContract


class TestMemoryKeyLines(KeyLinesContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.shared = MemoryKeyLines()

    def make_lines(self) -> KeyLines:
        return self.shared  # one process: every user shares the one object


class _Owned(SqlKeyLines):
    """Lines over a database of their own (a process each), closed with the test."""

    def __init__(self, url: str) -> None:
        self.database = Database(open_engine(url), owned=True)
        super().__init__(self.database)

    def close(self) -> None:
        self.database.close()


@pytest.fixture(scope="module")
def pg_lines_url(pg_server: Any) -> str:
    """One migrated PostgreSQL database for the module (emptied before each test)."""
    url = (
        pg_server
        if isinstance(pg_server, str)
        else pg_server.create_database(f"key_lines_{os.getpid()}")
    )
    upgrade(url)
    return str(url)


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = tmp_path_factory.mktemp("key-lines") / "migrated.db"
    upgrade(f"sqlite:///{template}")
    return template


class TestSqlKeyLines(KeyLinesContract):
    @pytest.fixture(
        autouse=True, params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
    )
    def _db(self, request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> None:
        if request.param == "sqlite":
            import shutil

            shutil.copyfile(sqlite_template, tmp_path / "q.db")
            self.url = f"sqlite:///{tmp_path / 'q.db'}"
            return
        self.url = request.getfixturevalue("pg_lines_url")
        engine = open_engine(self.url)
        with engine.begin() as conn:
            conn.execute(delete(key_holds))
        engine.dispose()

    def make_lines(self) -> KeyLines:
        return _Owned(self.url)

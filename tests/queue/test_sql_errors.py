"""Driver and pool errors become ours (review items 4 and 10): only "cannot reach it right now" is
retryable; the schema check reads without SQLite's write lock; engines get timeouts and pool sizes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import ProgrammingError

import migrations.sql as migrations_sql
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import current_revision, upgrade
from outbox.core import sql
from outbox.core.errors import QueueError, QueueUnavailableError
from outbox.core.sql import make_engine, translate


class _Orig(Exception):
    def __init__(self, text: str, sqlstate: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


def _denied() -> ProgrammingError:
    return ProgrammingError(
        "SELECT 1", {}, _Orig("permission denied for table outbox_sql_version", "42501")
    )


def test_an_exhausted_pool_is_retryable_unavailability(migrated_url: str) -> None:
    engine = make_engine(migrated_url, pool_size=1, max_overflow=0, pool_timeout=0.01)
    queue = SqlQueue(engine)
    try:
        with (
            engine.connect(),  # the only connection is taken
            pytest.raises(QueueUnavailableError, match="unreachable or busy") as e,
        ):
            queue.peek("q")
        assert e.value.retryable
    finally:
        queue.close()
        engine.dispose()


def test_permission_denied_is_not_reported_as_unreachable(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    error = translate(_denied(), engine, "read the schema revision")
    assert type(error) is QueueError
    assert not error.retryable
    assert "refused access" in str(error)
    assert "permission denied" in str(error)


def test_migrations_report_a_denied_database_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*_a: Any, **_kw: Any) -> Any:
        raise _denied()

    monkeypatch.setattr(migrations_sql, "inspect", denied)
    with pytest.raises(QueueError, match="refused access") as e:
        current_revision(f"sqlite:///{tmp_path / 'x.db'}")
    assert not isinstance(e.value, QueueUnavailableError)


def test_the_schema_check_does_not_wait_for_the_sqlite_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    upgrade(url)
    writer = sqlite3.connect(tmp_path / "outbox.db", isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        engine = make_engine(url, connect_args={"timeout": 0.05})
        assert current_revision(engine) == migrations_sql.head_revision()
        engine.dispose()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_postgres_engines_have_a_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_create_engine(_url: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return object()

    monkeypatch.setattr(sql, "create_engine", fake_create_engine)
    make_engine("postgresql+psycopg://u@db.example/outbox", pool_size=12)
    assert seen["connect_args"]["connect_timeout"] == sql.PG_CONNECT_TIMEOUT_S
    assert seen["pool_size"] == 12


def test_pool_size_can_be_chosen_and_grown(migrated_url: str) -> None:
    queue = SqlQueue(migrated_url, pool_size=3)
    try:
        assert queue.engine.pool.size() == 3  # type: ignore[attr-defined]
        queue.ensure_pool_size(20)
        assert queue.engine.pool.size() == 20  # type: ignore[attr-defined]
        assert queue.peek("q") == []
    finally:
        queue.close()

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
    real_create_engine = sql.create_engine

    def fake_create_engine(url: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        return real_create_engine(url, **kwargs)  # connects only when used

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


@pytest.mark.postgres
def test_postgres_connections_are_pinged_only_after_sitting_idle(pg_url: str) -> None:
    """A connection used a moment ago is not pinged (a round trip per checkout was a third of a
    receive+complete's client CPU); one that sat idle is, and one the server dropped meanwhile is
    replaced instead of failing the operation. Removing either half fails this test."""
    from sqlalchemy import create_engine, text

    now = [0.0]
    engine = create_engine(
        sql.parse_url(pg_url).set(drivername="postgresql+psycopg"), pool_size=1, max_overflow=0
    )
    sql.ping_when_idle(engine, idle=0.1, clock=lambda: now[0])
    pings: list[int] = []
    real_ping = engine.dialect.do_ping

    def counting_ping(dbapi_conn: Any) -> bool:
        pings.append(1)
        return real_ping(dbapi_conn)

    engine.dialect.do_ping = counting_ping  # type: ignore[method-assign]
    try:
        with engine.connect() as c:
            pid = c.execute(text("SELECT pg_backend_pid()")).scalar_one()
        for _ in range(3):  # back to back: no ping
            with engine.connect() as c:
                c.execute(text("SELECT 1"))
        assert pings == []
        # the server drops the pooled connection while it sits idle past the window
        admin = make_engine(pg_url)
        with admin.connect() as a:
            a.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        admin.dispose()
        now[0] += 0.2
        with engine.connect() as c:  # pinged, found dead, replaced: the query still works
            assert c.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
        assert pings == [1]
    finally:
        engine.dispose()


def test_postgres_engines_do_not_ping_on_every_checkout() -> None:
    engine = make_engine("postgresql+psycopg://u@db.example/outbox")
    assert engine.pool._pre_ping is False  # type: ignore[attr-defined]
    assert sql.PING_AFTER_IDLE_S <= 1.0  # a restarted server is found before use

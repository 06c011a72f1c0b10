"""The shipped claim-log contract on the SQL claim log (SQLite file and real PostgreSQL), and its
driver errors translated."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from dispatcher.claims.ports import ClaimLog
from dispatcher.claims.sql import SqlClaimLog
from migrations.sql import upgrade
from migrations.sql.tables import claim_sessions, claims
from outbox.core.errors import ClaimLogError, ClaimLogUnavailableError
from outbox.core.sql import make_engine
from outbox.testing.contracts.claim_log import ClaimLogContract, at


@pytest.fixture(scope="module")
def pg_claims_url(pg_server: Any) -> str:
    """One migrated PostgreSQL database for the module (emptied before each test): creating and
    migrating a database per test would cost more than the tests."""
    url = (
        pg_server
        if isinstance(pg_server, str)
        else pg_server.create_database(f"claims_{os.getpid()}")
    )
    upgrade(url)
    return str(url)


class TestSqlClaimLog(ClaimLogContract):
    @pytest.fixture(
        autouse=True, params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
    )
    def _db(self, request: pytest.FixtureRequest, tmp_path: Path, migrated_sqlite: Any) -> None:
        if request.param == "sqlite":
            self.url = migrated_sqlite(tmp_path / "claims.db")
            return
        self.url = request.getfixturevalue("pg_claims_url")
        engine = make_engine(self.url)
        with engine.begin() as conn:
            conn.execute(delete(claims))
            conn.execute(delete(claim_sessions))
        engine.dispose()

    def make_log(self) -> ClaimLog:
        log = SqlClaimLog(self.url)
        assert isinstance(log, ClaimLog)
        return log


def test_an_unmigrated_database_says_migrate(tmp_path: Path) -> None:
    log = SqlClaimLog(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(ClaimLogError, match="outbox migrate"):
        log.read("k")
    log.close()


def test_an_unreachable_database_is_retryable() -> None:
    log = SqlClaimLog("postgresql+psycopg://nobody@127.0.0.1:1/nothing")
    with pytest.raises(ClaimLogUnavailableError) as err:
        log.claim("k", "east", lease=timedelta(seconds=5), at=at(0))
    assert err.value.retryable
    log.close()

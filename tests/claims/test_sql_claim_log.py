"""The shipped claim-log contract on the SQL claim log (SQLite file and real PostgreSQL), and its
driver errors translated."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from dispatcher.claims.ports import ClaimLog
from dispatcher.claims.sql import SqlClaimLog
from migrations.sql import upgrade
from outbox.core.errors import ClaimLogError, ClaimLogUnavailableError
from outbox.testing.contracts.claim_log import ClaimLogContract, at


class TestSqlClaimLog(ClaimLogContract):
    @pytest.fixture(autouse=True)
    def _db(self, sql_url: str) -> None:
        upgrade(sql_url)
        self.url = sql_url

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

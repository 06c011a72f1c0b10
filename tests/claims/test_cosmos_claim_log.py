"""The shipped claim-log contract on ``CosmosClaimLog`` over the local Cosmos-protocol server
(409 on a repeated create, 412 on a stale etag)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.claims.cosmos import CosmosClaimLog
from dispatcher.claims.ports import ClaimLog
from outbox.core.errors import ClaimLogUnavailableError
from outbox.testing.contracts.claim_log import LEASE, ClaimLogContract, at

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


class TestCosmosClaimLog(ClaimLogContract):
    @pytest.fixture(autouse=True)
    def _container(self, cosmos_claims_container: Any) -> None:
        self.container = cosmos_claims_container

    def make_log(self) -> ClaimLog:
        log = CosmosClaimLog(self.container)
        assert isinstance(log, ClaimLog)
        return log


def test_an_unreachable_account_is_retryable(cosmos_claims_container: Any) -> None:
    class Down:
        def __getattr__(self, name: str) -> Any:
            def fail(*_a: Any, **_k: Any) -> Any:
                raise ConnectionError("connection refused")

            return fail

    log = CosmosClaimLog(Down(), endpoint="https://nowhere")
    with pytest.raises(ClaimLogUnavailableError, match="nowhere") as err:
        log.claim("k", "east", lease=LEASE, at=at(0))
    assert err.value.retryable

"""The shipped claim-log contract on ``CosmosClaimLog`` over the local Cosmos-protocol server
(409 on a repeated create, 412 on a stale etag)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.claims.cosmos import CosmosClaimLog
from dispatcher.claims.ports import ClaimLog
from outbox.core.cosmos import ensure_container, make_client
from outbox.core.errors import ClaimLogError, ClaimLogUnavailableError
from outbox.core.settings import Settings
from outbox.testing.contracts.claim_log import LEASE, ClaimLogContract, at
from tests.claims.conftest import CLAIMS_CONTAINER

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


@pytest.fixture(scope="module")
def live_claims_container(live_cosmos_settings: Settings) -> Iterator[Any]:
    """A claim container on a real account (OUTBOX_COSMOS_ENDPOINT/KEY), deleted afterwards."""
    s = live_cosmos_settings
    client = make_client(
        s.cosmos_endpoint, s.cosmos_key, unavailable=ClaimLogUnavailableError, failed=ClaimLogError
    )
    ensure_container(client, s.cosmos_database, CLAIMS_CONTAINER)
    yield client.get_database_client(s.cosmos_database).get_container_client(CLAIMS_CONTAINER)
    client.delete_database(s.cosmos_database)


@pytest.mark.live
class TestLiveCosmosClaimLog(ClaimLogContract):
    """The contract on a real Cosmos DB account, when one is configured (skipped otherwise)."""

    @pytest.fixture(autouse=True)
    def _container(self, live_claims_container: Any) -> None:
        self.container = live_claims_container
        for item in list(
            self.container.query_items("SELECT * FROM c", enable_cross_partition_query=True)
        ):
            self.container.delete_item(item["id"], partition_key=item["pk"])

    def make_log(self) -> ClaimLog:
        return CosmosClaimLog(self.container)

"""The same contracts against a real Cosmos DB account, when OUTBOX_COSMOS_ENDPOINT and
OUTBOX_COSMOS_KEY are set (skipped with that message otherwise). Each test module run creates a
database named ``outbox-live-test-*`` and deletes it at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.queue.inbox import Inbox
from dispatcher.queue.inbox_cosmos import CosmosInbox
from migrations.runner import ensure_cosmos
from outbox.core.cosmos import make_client
from outbox.core.errors import CheckpointError, CheckpointUnavailableError
from outbox.core.settings import Settings
from outbox.testing.contracts.checkpoint_store import CheckpointStoreContract
from outbox.testing.contracts.inbox import InboxContract
from rescuer.checkpoint import CheckpointStore
from rescuer.checkpoint_cosmos import CosmosCheckpointStore

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def live(live_cosmos_settings: Settings) -> Iterator[tuple[Settings, Any]]:
    s = live_cosmos_settings
    client = make_client(
        s.cosmos_endpoint,
        s.cosmos_key,
        unavailable=CheckpointUnavailableError,
        failed=CheckpointError,
    )
    actions = ensure_cosmos(s)
    assert any("created Cosmos DB database" in a for a in actions)
    assert ensure_cosmos(s) == []  # idempotent on the real service too
    yield s, client
    client.delete_database(s.cosmos_database)


class TestLiveCosmosCheckpointStore(CheckpointStoreContract):
    @pytest.fixture(autouse=True)
    def _live(self, live: tuple[Settings, Any]) -> None:
        self.settings, client = live
        self.container = client.get_database_client(
            self.settings.cosmos_database
        ).get_container_client(self.settings.cosmos_checkpoint_container)
        for item in list(
            self.container.query_items("SELECT * FROM c", enable_cross_partition_query=True)
        ):
            self.container.delete_item(item["id"], partition_key=item["pk"])

    def make_checkpoint_store(self) -> CheckpointStore:
        return CosmosCheckpointStore(self.container)


class TestLiveCosmosInbox(InboxContract):
    @pytest.fixture(autouse=True)
    def _live(self, live: tuple[Settings, Any]) -> None:
        self.settings, client = live
        self.container = client.get_database_client(
            self.settings.cosmos_database
        ).get_container_client(self.settings.cosmos_inbox_container)
        for item in list(
            self.container.query_items("SELECT * FROM c", enable_cross_partition_query=True)
        ):
            self.container.delete_item(item["id"], partition_key=item["pk"])

    def make_inbox(self, consumer: str) -> Inbox:
        return CosmosInbox(self.container, consumer)


def test_a_missing_item_is_a_404_on_the_real_service(live: tuple[Settings, Any]) -> None:
    """What the local server gets wrong (500): recorded here so docs/cosmos.md stays honest."""
    from azure.cosmos.exceptions import CosmosResourceNotFoundError

    settings, client = live
    container = client.get_database_client(settings.cosmos_database).get_container_client(
        settings.cosmos_checkpoint_container
    )
    with pytest.raises(CosmosResourceNotFoundError):
        container.read_item("missing", partition_key="missing")

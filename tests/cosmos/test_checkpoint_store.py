"""The shipped checkpoint-store contract on ``CosmosCheckpointStore`` over the local
Cosmos-protocol server: etag compare-and-set (412), conflicting creates (409), racing writers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from outbox.core.errors import CheckpointConflictError, CheckpointError
from outbox.testing.contracts.checkpoint_store import CheckpointStoreContract
from rescuer.checkpoint import CheckpointStore
from rescuer.checkpoint_cosmos import CosmosCheckpointStore, item_id

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class TestCosmosCheckpointStore(CheckpointStoreContract):
    @pytest.fixture(autouse=True)
    def _container(self, cosmos_container: Any) -> None:
        self.container = cosmos_container

    def make_checkpoint_store(self) -> CheckpointStore:
        return CosmosCheckpointStore(self.container)


def test_a_table_uri_with_slashes_and_details_round_trip(cosmos_container: Any) -> None:
    store = CosmosCheckpointStore(cosmos_container)
    uri = "abfss://docs@acct.dfs.core.windows.net/tables/orders?x#y"
    store.write(uri, "r", expected_generation=None, version=0, at=NOW, details={"table_id": "T"})
    got = store.read(uri, "r")
    assert got is not None
    assert (got.version, got.generation, got.table_id, got.updated_at) == (0, 1, "T", NOW)
    assert [c.table_uri for c in store.list()] == [uri]
    assert store.list("other") == []


def test_a_stale_etag_is_a_conflict_even_at_the_same_generation(cosmos_container: Any) -> None:
    """The item was rewritten behind the store's back at the same generation: only the etag can
    tell, and the replace is refused (412) instead of overwriting it."""
    store = CosmosCheckpointStore(cosmos_container)
    store.write("t", "r", expected_generation=None, version=1, at=NOW, details={})
    [item] = cosmos_container.query_items("SELECT * FROM c WHERE c.pk = 't'", partition_key="t")
    cosmos_container.upsert_item({**item, "details": {"touched": True}})  # the etag moves
    with pytest.raises(CheckpointConflictError, match="moved by another rescuer"):
        store.write("t", "r", expected_generation=1, version=2, at=NOW, details={})
    got = store.read("t", "r")
    assert got is not None
    assert (got.version, got.details) == (1, {"touched": True})
    again = store.write("t", "r", expected_generation=1, version=2, at=NOW, details={})
    assert again.generation == 2  # after a fresh read the same write goes through


def test_a_damaged_item_is_a_clear_error(cosmos_container: Any) -> None:
    store = CosmosCheckpointStore(cosmos_container)
    cosmos_container.create_item(
        {
            "id": item_id("t", "r"),
            "pk": "t",
            "table_uri": "t",
            "rescuer_name": "r",
            "generation": 3,
            "version": "x",
            "updated_at": NOW.isoformat(),
        }
    )
    assert store.generation("t", "r") == 3
    with pytest.raises(CheckpointError, match="unreadable fields"):
        store.read("t", "r")

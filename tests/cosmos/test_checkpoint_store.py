"""The shipped checkpoint-store contract on ``CosmosCheckpointStore`` over the local
Cosmos-protocol server: etag compare-and-set (412), conflicting creates (409), racing writers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from outbox.core.errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointUnavailableError,
)
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


class _RacingHeaders:
    """The container, whose next ``failures`` queries fail as azure-cosmos 4.17.1's do when
    another thread's request wrote into the headers this query was copying (docs/cosmos.md)."""

    def __init__(self, container: Any, failures: int, message: str) -> None:
        self._container, self.failures, self.message = container, failures, message

    def query_items(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise RuntimeError(self.message)
        return self._container.query_items(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)


RACE = "OrderedDict mutated during iteration"


def test_a_query_the_sdk_tripped_over_its_shared_headers_is_asked_again(
    cosmos_container: Any,
) -> None:
    store = CosmosCheckpointStore(cosmos_container)
    store.write("t", "r", expected_generation=None, version=4, at=NOW, details={})
    racing = _RacingHeaders(cosmos_container, 4, RACE)
    got = CosmosCheckpointStore(racing).read("t", "r")
    assert got is not None
    assert got.version == 4
    assert racing.failures == 0


def test_the_header_race_is_retried_a_bounded_number_of_times_and_nothing_else_is(
    cosmos_container: Any,
) -> None:
    for failures, message in ((5, RACE), (1, "something else went wrong")):
        store = CosmosCheckpointStore(_RacingHeaders(cosmos_container, failures, message))
        with pytest.raises(CheckpointUnavailableError):
            store.read("t", "r")

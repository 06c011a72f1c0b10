"""The inbox pruning contract on ``CosmosInbox`` over the local Cosmos-protocol server: a query,
then a delete per item with ``If-Match`` (the server has no time-to-live, so the framework does
not rely on one)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.queue.inbox import Inbox
from dispatcher.queue.inbox_cosmos import CosmosInbox, item_id
from tests.queue.inbox_pruning import LEASE, T0, InboxPruningContract


class TestCosmosInboxPruning(InboxPruningContract):
    @pytest.fixture(autouse=True)
    def _container(self, cosmos_inbox_container: Any) -> None:
        self.container = cosmos_inbox_container

    def make_inbox(self, consumer: str) -> Inbox:
        return CosmosInbox(self.container, consumer)


def test_an_item_claimed_between_the_query_and_the_delete_stays(
    cosmos_inbox_container: Any,
) -> None:
    """The delete carries the etag the query read: a released claim taken again in between is
    a live claim, and the account refuses the delete (HTTP 412)."""
    inbox = CosmosInbox(cosmos_inbox_container, "billing")
    assert inbox.claim("m", "a", lease=LEASE, at=T0).won
    inbox.release("m", "a")
    [stale] = inbox._query("SELECT c.id, c._etag FROM c")
    assert inbox.claim("m", "b", lease=LEASE, at=T0).won
    assert inbox._delete_if_unchanged(stale, "pruning the inbox") is False
    assert inbox.claim("m", "c", lease=LEASE, at=T0).held
    assert stale["id"] == item_id("billing", "m")

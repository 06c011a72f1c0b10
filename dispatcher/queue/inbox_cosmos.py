"""A consumer inbox in a Cosmos DB container: a claim is a *conditional create*, every later move
a *replace with the etag* read.

One item per (consumer, message id)::

    {"id": sha256(consumer, message_id), "pk": <the same>, "consumer": ..., "message_id": ...,
     "handled_at": "..." | null, "owner": "..." | null, "lease_until": "..." | null}

* ``handled_at`` set: the id was handled (items written before claims existed have only it, and
  keep meaning "handled"). Otherwise the item is a claim of ``owner`` until ``lease_until``
  (null: released).
* ``claim``: ``create_item`` for the first claimer; HTTP 409 means the item exists, so it is
  read: handled -> ``HANDLED``; another owner's live lease -> ``HELD``; else (released, expired,
  or the caller's own) ``replace_item`` with ``If-Match: <etag>``, where HTTP 412 means someone
  wrote in between and the item is read again. ``record``, ``renew`` and ``release`` are the same
  read-then-replace. So of racing claimers exactly one wins, as with the SQL inbox.
* Cosmos DB checks id uniqueness per logical partition, so the id and the partition key are the
  same hash: uniqueness per (consumer, message id), items spread over every partition, and each
  lookup is a single-partition query. The id is a hash because ids may not contain ``/``.
* Items are read with a query, not a point read: the local test server answers a read of a
  missing item with HTTP 500 instead of 404.

What the consumer guarantees with this inbox: it cannot join the queue's SQL transaction, so
the consumer runs claim -> handler -> record -> complete, each its own step. At most one handler
runs at a time per message id per consumer name; a concurrent duplicate waits (its queue copy is
abandoned until the claim's lease ends) and is dropped once the id is recorded. A handler runs
again only after it failed (the claim is released), or after a crash or hang outlived the lease
(the claim is taken over). A crash after the record but before the completion redelivers the
message, and the inbox drops it. At-least-once with no concurrent duplicates: the handler must
tolerate a second run in those cases (idempotent effects, or effects in the same Cosmos
partition guarded by their own etags). A handler that takes a SQL ``Connection`` needs the SQL
inbox; the consumer refuses that pairing.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from dispatcher.queue.inbox import PRUNE_CHUNK, ClaimOutcome, InboxClaim
from outbox.core.clock import utc
from outbox.core.cosmos_adapter import CosmosAdapter
from outbox.core.errors import QueueError, QueueUnavailableError
from outbox.core.settings import Settings

#: Reads of an item that keeps changing under one step before giving up (retryable).
_ATTEMPTS = 20
#: What ``prune`` deletes: handled before @before, or a claim released or ended before it.
#: ISO 8601 UTC texts of one format order as their times do.
_DONE = (
    "(IS_STRING(c.handled_at) AND c.handled_at < @before) OR (NOT IS_STRING(c.handled_at) AND "
    "(NOT IS_STRING(c.lease_until) OR c.lease_until < @before))"
)


def item_id(consumer: str, message_id: str) -> str:
    raw = json.dumps([consumer, message_id], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def _when(text: str | None) -> datetime | None:
    return None if text is None else utc(datetime.fromisoformat(text))


class CosmosInbox(CosmosAdapter):
    """Handled ids and live claims of ``consumer`` in the container ``cosmos_inbox_container``
    (partition key ``/pk``, created by ``outbox migrate``). ``container`` is an azure-cosmos
    ``ContainerProxy``.

    ``prune`` (``outbox maintain``, and a running ``Consumer`` hourly) deletes what nothing
    needs any more, by a query and a delete per item with ``If-Match: <etag>``: a claim taken
    between the two keeps its item (HTTP 412). Not a time-to-live: an item's ``ttl`` needs the
    container's ``defaultTtl`` set, which ``outbox migrate`` does not set on an existing
    container, and the local Cosmos-protocol server the tests run on has no time-to-live, so
    it could not be proven here.
    """

    unavailable = QueueUnavailableError
    failed = QueueError
    subject = "the inbox"

    def __init__(
        self, container: Any, consumer: str, *, endpoint: str = "", client: Any = None
    ) -> None:
        super().__init__(container, endpoint=endpoint, client=client)
        self.consumer = consumer

    @classmethod
    def from_settings(cls, settings: Settings, consumer: str) -> CosmosInbox:
        return cls._open(settings, settings.cosmos_inbox_container, consumer)

    # --- the edge ------------------------------------------------------------------------

    def _body(self, key: str, message_id: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": key,
            "pk": key,
            "consumer": self.consumer,
            "message_id": message_id,
            "handled_at": None,
            "owner": None,
            "lease_until": None,
            **fields,
        }

    def _kept_moving(self, what: str, message_id: str) -> QueueUnavailableError:
        return QueueUnavailableError(
            f"{what} message {message_id!r} in the inbox: the item kept changing under "
            f"{_ATTEMPTS} attempts",
            hint="retry; many deliveries of one message id at once cause this",
        )

    # --- the port ------------------------------------------------------------------------

    def handled(self, message_id: str) -> bool:
        item = self._find(item_id(self.consumer, message_id))
        return item is not None and item.get("handled_at") is not None

    def claim(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> InboxClaim:
        key = item_id(self.consumer, message_id)
        until = utc(at + lease)
        mine = {"owner": owner, "lease_until": until.isoformat()}
        won = InboxClaim(ClaimOutcome.WON, owner, until)
        for _ in range(_ATTEMPTS):
            if self._create(self._body(key, message_id, **mine)) is not None:
                return won
            item = self._find(key)
            if item is None:
                continue  # deleted in between (a time-to-live): create again
            if item.get("handled_at") is not None:
                return InboxClaim(ClaimOutcome.HANDLED, item.get("owner"), None)
            holder, lease_until = item.get("owner"), _when(item.get("lease_until"))
            if holder != owner and lease_until is not None and lease_until > utc(at):
                return InboxClaim(ClaimOutcome.HELD, holder, lease_until)
            if self._amend(item, **mine) is not None:
                return won
        raise self._kept_moving("claiming", message_id)

    def _move(self, message_id: str, owner: str, changes: dict[str, Any]) -> bool:
        """Replace ``owner``'s claim with ``changes``; False when ``owner`` does not hold it."""
        key = item_id(self.consumer, message_id)
        for _ in range(_ATTEMPTS):
            item = self._find(key)
            if item is None or item.get("handled_at") is not None or item.get("owner") != owner:
                return False
            if self._amend(item, **changes) is not None:
                return True
        raise self._kept_moving("moving the claim of", message_id)

    def renew(self, message_id: str, owner: str, *, lease: timedelta, at: datetime) -> bool:
        return self._move(message_id, owner, {"lease_until": utc(at + lease).isoformat()})

    def release(self, message_id: str, owner: str) -> None:
        self._move(message_id, owner, {"owner": None, "lease_until": None})

    def record(self, message_id: str, *, at: datetime) -> bool:
        key = item_id(self.consumer, message_id)
        handled_at = utc(at).isoformat()
        for _ in range(_ATTEMPTS):
            if self._create(self._body(key, message_id, handled_at=handled_at)) is not None:
                return True
            item = self._find(key)
            if item is None:
                continue
            if item.get("handled_at") is not None:
                return False  # someone recorded first
            # the claim's owner stays, as who handled it
            if self._amend(item, handled_at=handled_at, lease_until=None) is not None:
                return True
        raise self._kept_moving("recording", message_id)

    def prune(
        self, before: datetime, *, limit: int | None = None, every_consumer: bool = False
    ) -> int:
        """See ``PrunableInbox.prune``: cross-partition queries of ``PRUNE_CHUNK`` items, then a
        conditional delete per item (an item changed since the query is left for the next
        prune)."""
        where, params = f"({_DONE})", {"@before": utc(before).isoformat()}
        if not every_consumer:
            where += " AND c.consumer = @consumer"
            params["@consumer"] = self.consumer
        deleted = 0
        while limit is None or deleted < limit:
            chunk = PRUNE_CHUNK if limit is None else min(PRUNE_CHUNK, limit - deleted)
            found = self._query(f"SELECT TOP {chunk} c.id, c._etag FROM c WHERE {where}", params)
            gone = sum(self._delete_if_unchanged(item, "pruning the inbox") for item in found)
            deleted += gone
            if len(found) < chunk or gone == 0:
                break
        return deleted

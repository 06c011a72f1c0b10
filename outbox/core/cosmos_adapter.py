"""The base of the three Cosmos DB adapters (rescuer checkpoints, consumer inbox, claim log):
one container, one edge every request goes through, and the requests they make alike.

Why apart from ``outbox.core.cosmos``: that module opens the account, checks the key, provisions
containers and translates the SDK's errors (what ``outbox migrate`` needs too); this one is what
an adapter does with a container once it has one, including two workarounds for azure-cosmos's
thread safety (docs/cosmos.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from outbox.core.cosmos import (
    CONFLICT,
    NOT_FOUND,
    PRECONDITION_FAILED,
    make_client,
    status_code,
    translate,
)
from outbox.core.errors import OutboxError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

T = TypeVar("T")

#: Times a query is repeated when the SDK's own header bookkeeping raced another thread's request.
_HEADER_RACE_TRIES = 5


def _read_racing_headers(read: Callable[[], T]) -> T:
    """``read()`` (a query: it changes nothing), again when azure-cosmos 4.17 tripped over its
    own shared state. The SDK stores each response's headers on the client
    (``last_response_headers``) and its retry wrapper then writes two throttle counters into
    whatever that attribute holds, which may be another thread's headers while that thread's query
    copies them: ``RuntimeError: OrderedDict mutated during iteration``, after the answer arrived.
    Point reads and writes never copy their headers, so only queries meet it; a query can simply
    be asked again (docs/cosmos.md, "threads")."""
    for _ in range(_HEADER_RACE_TRIES - 1):
        try:
            return read()
        except RuntimeError as e:
            if "mutated during iteration" not in str(e):
                raise
    return read()


class CosmosAdapter:
    """What every Cosmos DB adapter (checkpoints, inbox, claim log) shares: one container, the
    client it opened and closes, and one edge every request goes through (``_call``): SDK errors
    turned into the adapter's own pair, and a first request that goes alone. On it sit the
    requests the adapters make alike: a query, the lookup of an item whose id is its partition
    key, a conditional create and a replace with the etag read.

    Why the first request goes alone: azure-cosmos fills a container's caches on its first
    request without a lock, and racing first requests from several threads can fail inside the
    SDK. A query fills caches of its own (a point write before it does not), so the first query
    of each kind also goes alone. (An ``OrderedDict mutated during iteration`` in the SDK's query
    feed, once blamed on those caches, was the header race ``_read_racing_headers`` handles: it
    came back in a later query, after the first.)
    Subclasses set ``unavailable`` (retryable), ``failed`` and ``subject`` (what the errors say
    is being read or written).
    """

    unavailable: ClassVar[type[OutboxError]] = OutboxError
    failed: ClassVar[type[OutboxError]] = OutboxError
    subject: ClassVar[str] = "Cosmos DB"
    #: keyword arguments every SDK request carries (``CosmosClaimLog.bounded`` sets timeouts)
    _request: dict[str, Any] = {}  # replaced, never mutated

    def __init__(self, container: Any, *, endpoint: str = "", client: Any = None) -> None:
        self._container = container
        self._endpoint = endpoint or "the configured account"
        self._client = client
        self._guard = threading.Lock()
        self._warm: set[str] = set()  # the kinds of request that completed once

    @classmethod
    def _open(cls, settings: Settings, container: str, *args: Any) -> Self:
        """The adapter on ``container`` in the configured database, with a client of its own
        (closed by ``close``); ``args`` go to the constructor after the container."""
        client = make_client(
            settings.cosmos_endpoint,
            settings.cosmos_key,
            unavailable=cls.unavailable,
            failed=cls.failed,
        )
        proxy = client.get_database_client(settings.cosmos_database).get_container_client(container)
        return cls(proxy, *args, endpoint=settings.cosmos_endpoint, client=client)

    def close(self) -> None:
        if self._client is not None:
            close = getattr(self._client, "close", None)
            if callable(close):
                close()
            self._client = None

    def _error(self, what: str, e: Exception) -> OutboxError:
        return translate(e, what, self._endpoint, unavailable=self.unavailable, failed=self.failed)

    def _once_warm(self, call: Callable[[], T], kind: str = "point") -> T:
        """``call()``, alone if no request of its ``kind`` has completed yet (see the class
        docstring)."""
        if kind in self._warm:
            return call()
        with self._guard:
            out = call()
            self._warm.add(kind)
            return out

    def _call(self, what: str, call: Callable[[], T], *, kind: str = "point") -> T:
        """``call()`` (one SDK request) through the first-request guard, an SDK error raised as
        ours (its ``__cause__`` the SDK's error, whose status ``_refused`` reads)."""
        try:
            return self._once_warm(call, kind)
        except OutboxError:
            raise
        except Exception as e:
            raise self._error(what, e) from e

    @staticmethod
    def _refused(error: BaseException, statuses: Collection[int]) -> bool:
        """Whether ``error`` (from ``_call``) is the account answering one of ``statuses``."""
        return status_code(error.__cause__ or error) in statuses

    def _query(
        self,
        sql: str,
        params: Mapping[str, Any] | None = None,
        *,
        pk: str | None = None,
        what: str = "",
    ) -> list[dict[str, Any]]:
        """The items ``sql`` selects (``params``: ``{"@name": value}``), in the logical
        partition ``pk`` or, when None, across partitions."""
        parameters = [{"name": k, "value": v} for k, v in (params or {}).items()]
        scope: dict[str, Any] = (
            {"partition_key": pk} if pk is not None else {"enable_cross_partition_query": True}
        )
        return self._call(
            what or f"reading {self.subject}",
            lambda: _read_racing_headers(
                lambda: list(
                    self._container.query_items(
                        sql, parameters=parameters, **scope, **self._request
                    )
                )
            ),
            kind="query" if pk is not None else "cross-partition query",
        )

    def _find(self, item_id: str) -> dict[str, Any] | None:
        """The item whose id and partition key are both ``item_id``, or None."""
        found = self._query(
            "SELECT * FROM c WHERE c.pk = @pk AND c.id = @pk", {"@pk": item_id}, pk=item_id
        )
        return found[0] if found else None

    def _create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Conditional create: the item written, or None when one with its id exists (409)."""
        try:
            out: dict[str, Any] = self._call(
                f"writing {self.subject}",
                lambda: self._container.create_item(body, **self._request),
            )
        except self.failed as e:
            if self._refused(e, (CONFLICT,)):
                return None
            raise
        return out

    def _replace(
        self, body: dict[str, Any], etag: str, *, stale: Collection[int] = (PRECONDITION_FAILED,)
    ) -> dict[str, Any] | None:
        """Replace the item ``body["id"]`` with ``body`` if it still has ``etag``: the item
        written, or None when the account answers one of ``stale`` (412: written since)."""
        from azure.core import MatchConditions

        try:
            out: dict[str, Any] = self._call(
                f"writing {self.subject}",
                lambda: self._container.replace_item(
                    body["id"],
                    body,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    **self._request,
                ),
            )
        except self.failed as e:
            if self._refused(e, stale):
                return None
            raise
        return out

    def _delete_if_unchanged(self, item: Mapping[str, Any], what: str) -> bool:
        """Delete ``item`` (whose id is its partition key) if it is as read (its ``_etag``):
        False when it changed or is gone since (412, 404). Pruning reads a page of items, then
        deletes each only if nobody wrote it meanwhile."""
        from azure.core import MatchConditions

        try:
            self._call(
                what,
                lambda: self._container.delete_item(
                    item["id"],
                    partition_key=item["id"],
                    etag=item["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                    **self._request,
                ),
            )
        except self.failed as e:
            if self._refused(e, (PRECONDITION_FAILED, NOT_FOUND)):
                return False
            raise
        return True

    def _amend(self, item: Mapping[str, Any], **changes: Any) -> dict[str, Any] | None:
        """``item`` as read, with ``changes``, if nobody wrote it since it was read (its
        ``_etag``): the item written, or None (412). The system fields (``_etag``, ``_ts``, ...)
        are the account's, never sent back."""
        body = {k: v for k, v in item.items() if not k.startswith("_")}
        body.update(changes)
        return self._replace(body, item["_etag"])

"""Cosmos DB clients for the rescuer checkpoints, the consumer inbox and the claim log, with
driver errors translated at this edge (the twin of ``outbox.core.sql``).

Why here: the checkpoint store (``rescuer``), the inbox (``dispatcher.queue``), the claim log
(``dispatcher.claims``) and ``outbox migrate`` (``migrations.runner``) open the same account the
same way and must turn the same SDK errors into the same advice; the three adapters also make the
same kinds of request (``CosmosAdapter``), so each keeps only its items and its rules.
``azure-cosmos`` is an optional extra, imported on first use, so nothing here loads the SDK unless
Cosmos DB is configured.

Every container the framework uses is partitioned on ``/pk`` (``PARTITION_KEY_PATH``); each
adapter says what it puts there. Items are found by *query*, never by a point read: the local
test server answers a read of a missing item with HTTP 500 instead of 404 (docs/cosmos.md).
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar
from urllib.parse import urlparse

from outbox.core.errors import ConfigurationError, MissingDependencyError, OutboxError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

T = TypeVar("T")

PARTITION_KEY_PATH = "/pk"
INSTALL_HINT = "pip install 'delta-outbox[azure]'"
MIGRATE_HINT = "run `outbox migrate` to create the Cosmos DB database and containers"
#: Seconds a connection attempt may take before it fails (retryably) instead of hanging.
CONNECT_TIMEOUT_S = 10
#: HTTP statuses the adapters act on: an item with that id exists, the etag is out of date, no such
#: item.
CONFLICT, PRECONDITION_FAILED, NOT_FOUND = 409, 412, 404
#: HTTP statuses that mean "busy or briefly away": the same request can succeed later.
_RETRYABLE_STATUSES = {408, 429, 449, 500, 502, 503, 504}
_LOCAL_HOSTS = {"localhost", "127.0.0.1"}


def _sdk() -> Any:
    try:
        import azure.cosmos
    except ImportError as e:
        raise MissingDependencyError(
            "Cosmos DB needs the azure-cosmos package, which is not installed",
            hint=INSTALL_HINT,
        ) from e
    return azure.cosmos


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


def status_code(error: BaseException) -> int | None:
    """The HTTP status of an SDK error (None when the request never got an answer)."""
    code = getattr(error, "status_code", None)
    return int(code) if isinstance(code, int) else None


def translate(
    error: Exception,
    what: str,
    endpoint: str,
    *,
    unavailable: type[OutboxError],
    failed: type[OutboxError],
) -> OutboxError:
    """``error`` from the SDK as one of ours: ``unavailable`` (retryable) when the account could
    not be reached or was busy, ``failed`` otherwise, each naming the endpoint and the fix."""
    if isinstance(error, OutboxError):
        return error
    if isinstance(error, binascii.Error):  # the SDK decoding the key to sign a request
        return malformed_key("it is not base64 text")
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    code = status_code(error)
    if code is None or code in _RETRYABLE_STATUSES:
        return unavailable(
            f"{what}: Cosmos DB at {endpoint} is unreachable or busy: {first}",
            hint="check cosmos_endpoint (OUTBOX_COSMOS_ENDPOINT) and the network, then retry; "
            "for the local test server run scripts/ensure-cosmos.sh",
        )
    if code in (401, 403):
        return failed(
            f"{what}: Cosmos DB at {endpoint} refused the credentials (HTTP {code})",
            hint="check cosmos_key (OUTBOX_COSMOS_KEY), or the role assignment of the identity "
            "DefaultAzureCredential found",
        )
    if code == 404:
        return failed(
            f"{what}: the Cosmos DB database or container is missing at {endpoint}",
            hint=MIGRATE_HINT,
        )
    return failed(f"{what}: Cosmos DB at {endpoint} answered HTTP {code}: {first}")


#: What to do about a malformed key (the CLI prints it as the fix).
KEY_HINT = (
    "set cosmos_key (OUTBOX_COSMOS_KEY) to the account's primary or secondary key, as the Azure "
    "portal shows it under Keys (or `az cosmosdb keys list`), or leave it empty to sign in with "
    "DefaultAzureCredential"
)


def malformed_key(reason: str) -> ConfigurationError:
    """The error for a ``cosmos_key`` that is no account key at all (never the key itself: it is
    a secret). Not retryable: no network problem, a setting to fix."""
    return ConfigurationError(
        f"setting 'cosmos_key' is not a valid Cosmos DB account key: {reason}", hint=KEY_HINT
    )


def check_key(key: str) -> None:
    """``ConfigurationError`` unless ``key`` decodes as base64, the way azure-cosmos decodes it to
    sign each request (``base64.b64decode``, which skips characters outside the alphabet, so a
    key the SDK would accept is never refused here). A key that decodes but is the wrong one is
    the account's to refuse (HTTP 401, reported as refused credentials)."""
    try:
        decoded = base64.b64decode(key)
    except (binascii.Error, ValueError):
        raise malformed_key("it is not base64 text") from None
    if not decoded:
        raise malformed_key("it holds no base64 data")


def _credential(key: str) -> Any:
    if key:
        check_key(key)
        return key
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as e:
        raise ConfigurationError(
            "setting 'cosmos_key' is empty and azure-identity is not installed",
            hint="set cosmos_key (OUTBOX_COSMOS_KEY), or pip install azure-identity to sign in "
            "with DefaultAzureCredential",
        ) from e
    return DefaultAzureCredential()


def make_client(
    endpoint: str,
    key: str,
    *,
    unavailable: type[OutboxError],
    failed: type[OutboxError],
) -> Any:
    """A ``CosmosClient`` for ``endpoint`` (the constructor already talks to the account).

    ``key`` empty: ``DefaultAzureCredential`` (needs azure-identity). The SDK skips certificate
    checks for ``localhost``/``127.0.0.1`` by itself (the local emulators' self-signed
    certificates); urllib3's warning about it is silenced for those hosts only.
    """
    sdk = _sdk()
    if not endpoint:
        raise ConfigurationError(
            "setting 'cosmos_endpoint' is empty",
            hint="set cosmos_endpoint (OUTBOX_COSMOS_ENDPOINT), e.g. "
            "https://ACCOUNT.documents.azure.com:443/",
        )
    azure_log = logging.getLogger("azure")
    if azure_log.level == logging.NOTSET:
        # the SDK logs every request and its headers at INFO: too loud for a CLI at INFO. A
        # level the application set on the "azure" logger is kept.
        azure_log.setLevel(logging.WARNING)
    host = urlparse(endpoint).hostname or ""
    if host in _LOCAL_HOSTS:
        warnings.filterwarnings(
            "ignore", message=f"Unverified HTTPS request is being made to host '{host}'"
        )
    try:
        return sdk.CosmosClient(
            endpoint, credential=_credential(key), connection_timeout=CONNECT_TIMEOUT_S
        )
    except Exception as e:
        raise translate(e, "connecting", endpoint, unavailable=unavailable, failed=failed) from e


def ensure_container(client: Any, database: str, container: str) -> list[str]:
    """Create the database and ``container`` (partition key ``/pk``) when missing; what was done.

    Idempotent. An existing container partitioned on another path is reported and left alone:
    changing a partition key means moving every item, which ``outbox migrate`` never does.
    """
    _sdk()  # a clear error when the extra is missing
    from azure.cosmos import PartitionKey
    from azure.cosmos.exceptions import CosmosResourceExistsError

    actions: list[str] = []
    try:
        client.create_database(database)
        actions.append(f"created Cosmos DB database {database}")
    except CosmosResourceExistsError:
        pass
    db = client.get_database_client(database)
    try:
        db.create_container(container, partition_key=PartitionKey(path=PARTITION_KEY_PATH))
        actions.append(
            f"created Cosmos DB container {database}/{container} "
            f"(partition key {PARTITION_KEY_PATH})"
        )
    except CosmosResourceExistsError:
        paths = db.get_container_client(container).read().get("partitionKey", {}).get("paths")
        if paths != [PARTITION_KEY_PATH]:
            raise ConfigurationError(
                f"the Cosmos DB container {database}/{container} is partitioned on {paths}, "
                f"not [{PARTITION_KEY_PATH!r}]; it was left unchanged",
                hint="point the container setting at a new container, or recreate this one "
                f"with partition key {PARTITION_KEY_PATH}",
            ) from None
    return actions


class CosmosAdapter:
    """What every Cosmos DB adapter (checkpoints, inbox, claim log) shares: one container, the
    client it opened and closes, and one edge every request goes through (``_call``): SDK errors
    turned into the adapter's own pair, and a first request that goes alone. On it sit the
    requests the adapters make alike: a query, the lookup of an item whose id is its partition
    key, a conditional create and a replace with the etag read.

    Why the first request goes alone: azure-cosmos fills a container's caches on its first
    request without a lock, and racing first requests from several threads can fail inside the
    SDK. A query fills caches of its own (a point write before it does not), so the first query
    also goes alone: eight threads' first queries after one create raised ``OrderedDict mutated
    during iteration`` inside the SDK's query feed once in a run of the checkpoint contract.
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

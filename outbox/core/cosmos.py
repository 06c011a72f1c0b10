"""Cosmos DB clients for the rescuer checkpoints, the consumer inbox and the claim log, with
driver errors translated at this edge (the twin of ``outbox.core.sql``).

Why here: the checkpoint store (``rescuer``), the inbox (``dispatcher.queue``), the claim log
(``dispatcher.claims``) and ``outbox migrate`` (``migrations.runner``) open the same account the
same way and must turn the same SDK errors into the same advice. The three adapters also make the
same kinds of request, so they share a base (``outbox.core.cosmos_adapter.CosmosAdapter``) and
each keeps only its items and its rules.
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
import warnings
from typing import Any
from urllib.parse import urlparse

from outbox.core.errors import ConfigurationError, MissingDependencyError, OutboxError

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

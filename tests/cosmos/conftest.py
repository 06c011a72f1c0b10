"""Cosmos DB fixtures: the local Cosmos-protocol server for the session, a fresh database per
test (so tests never see each other's items), and a live account when one is configured."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outbox.core.cosmos import ensure_container, make_client
from outbox.core.errors import CheckpointError, CheckpointUnavailableError
from outbox.core.settings import Settings
from tests.cosmos.server import KEY, CosmosServer, server_package
from tests.local_server import unavailable

LIVE_VARS = ("OUTBOX_COSMOS_ENDPOINT", "OUTBOX_COSMOS_KEY")
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The SDK skips certificate checks for 127.0.0.1 by design; urllib3 warns on each request."""
    quiet = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(quiet)


@pytest.fixture(scope="session")
def cosmos_endpoint() -> Iterator[str]:
    """The local server's https endpoint, started once per session and stopped at the end."""
    pytest.importorskip("azure.cosmos", reason="pip install 'delta-outbox[azure]'")
    package = server_package()
    if package is None:
        why = (
            "the local Cosmos DB server is not installed; run scripts/ensure-cosmos.sh "
            "(or set OUTBOX_TEST_COSMOS_DIR to a folder where @vercel/cosmosdb-server is installed)"
        )
        unavailable(why)
    server = CosmosServer(package)
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cosmos_client(cosmos_endpoint: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_client(
            cosmos_endpoint, KEY, unavailable=CheckpointUnavailableError, failed=CheckpointError
        )


@pytest.fixture
def cosmos_settings(cosmos_endpoint: str, tmp_path: Any) -> Settings:
    """Settings for the local server with a database of this test's own."""
    return Settings(
        workspace=tmp_path / "ws",
        checkpoint_store="cosmos",
        cosmos_endpoint=cosmos_endpoint,
        cosmos_key=KEY,
        cosmos_database=f"t{uuid.uuid4().hex[:12]}",
    )


@pytest.fixture
def cosmos_container(cosmos_client: Any, cosmos_settings: Settings) -> Any:
    """A fresh, empty container partitioned on /pk (the checkpoint container's shape)."""
    db, name = cosmos_settings.cosmos_database, cosmos_settings.cosmos_checkpoint_container
    ensure_container(cosmos_client, db, name)
    yield cosmos_client.get_database_client(db).get_container_client(name)
    cosmos_client.delete_database(db)


@pytest.fixture
def cosmos_inbox_container(cosmos_client: Any, cosmos_settings: Settings) -> Any:
    """A fresh, empty inbox container (partitioned on /pk)."""
    db, name = cosmos_settings.cosmos_database, cosmos_settings.cosmos_inbox_container
    ensure_container(cosmos_client, db, name)
    yield cosmos_client.get_database_client(db).get_container_client(name)
    cosmos_client.delete_database(db)


@pytest.fixture(scope="session")
def live_cosmos_settings() -> Settings:
    """A real Cosmos DB account from OUTBOX_COSMOS_ENDPOINT / OUTBOX_COSMOS_KEY, else a skip."""
    missing = [v for v in LIVE_VARS if not os.environ.get(v)]
    if missing:
        pytest.skip(
            f"live Cosmos DB tests are off: set {' and '.join(missing)} to run them against a "
            "real account (they create and delete a database named outbox-live-test-*)"
        )
    return Settings(
        checkpoint_store="cosmos",
        cosmos_endpoint=os.environ["OUTBOX_COSMOS_ENDPOINT"],
        cosmos_key=os.environ["OUTBOX_COSMOS_KEY"],
        cosmos_database=f"outbox-live-test-{uuid.uuid4().hex[:8]}",
    )

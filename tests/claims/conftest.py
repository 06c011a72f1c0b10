"""The Cosmos-protocol server fixtures of tests/cosmos, for the claim log's Cosmos backend."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.core.cosmos import ensure_container
from outbox.core.settings import Settings
from tests.cosmos.conftest import (
    cosmos_client,
    cosmos_endpoint,
    cosmos_settings,
    live_cosmos_settings,
)

__all__ = ["cosmos_client", "cosmos_endpoint", "cosmos_settings", "live_cosmos_settings"]

CLAIMS_CONTAINER = "outbox-claims"


@pytest.fixture
def cosmos_claims_container(cosmos_client: Any, cosmos_settings: Settings) -> Any:
    """A fresh, empty claim container (partitioned on /pk) in a database of this test's own."""
    db = cosmos_settings.cosmos_database
    ensure_container(cosmos_client, db, CLAIMS_CONTAINER)
    yield cosmos_client.get_database_client(db).get_container_client(CLAIMS_CONTAINER)
    cosmos_client.delete_database(db)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``make(path) -> url``: a SQLite file at the newest schema, copied from one migrated once
    per session (a migration per file would cost more than the tests that use them)."""
    import shutil
    from pathlib import Path

    from migrations.sql import upgrade

    template = tmp_path_factory.mktemp("claims-template") / "migrated.db"
    upgrade(f"sqlite:///{template}")  # the engine is disposed: the WAL is folded into the file

    def make(path: Path) -> str:
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"

    return make

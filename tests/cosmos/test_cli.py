"""The CLI with ``checkpoint_store = "cosmos"`` on the local Cosmos-protocol server: ``outbox
migrate`` provisions the containers, ``outbox rescue`` / ``status`` / ``--forget`` and the
log-trim guard read and write the checkpoints there; failures are one clear line."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dispatcher.claims.cosmos import CosmosClaimLog
from outbox.app.cli import main
from outbox.app.maintenance import oldest_needed_version
from outbox.core.clock import ManualClock
from outbox.core.cosmos import make_client
from outbox.core.errors import (
    CheckpointError,
    CheckpointUnavailableError,
    MissingDependencyError,
)
from outbox.core.model import DocumentRow
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from outbox.testing.servers import free_port
from outbox.wiring import Backends, check
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.checkpoint_cosmos import CosmosCheckpointStore


def _env(settings: Settings) -> dict[str, str]:
    return {
        "OUTBOX_CHECKPOINT_STORE": "cosmos",
        "OUTBOX_COSMOS_ENDPOINT": settings.cosmos_endpoint,
        "OUTBOX_COSMOS_KEY": settings.cosmos_key,
        "OUTBOX_COSMOS_DATABASE": settings.cosmos_database,
    }


def _json(output: str) -> Any:
    return json.loads(output[output.index("{") :])


def test_migrate_rescue_status_and_forget_use_cosmos(
    cosmos_settings: Settings, cosmos_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = str(cosmos_settings.workspace)
    env = _env(cosmos_settings)
    runner = CliRunner()
    first = runner.invoke(main, ["-w", ws, "migrate", "--json"], env=env)
    assert first.exit_code == 0, first.output
    db = cosmos_settings.cosmos_database
    assert {a for a in _json(first.output)["actions"] if "Cosmos" in a} == {
        f"created Cosmos DB database {db}",
        f"created Cosmos DB container {db}/checkpoints (partition key /pk)",
        f"created Cosmos DB container {db}/inbox (partition key /pk)",
        f"created Cosmos DB container {db}/claims (partition key /pk)",
    }
    again = runner.invoke(main, ["-w", ws, "migrate", "--json"], env=env)
    assert again.exit_code == 0, again.output
    assert not [a for a in _json(again.output)["actions"] if "Cosmos" in a]  # idempotent
    claims = CosmosClaimLog.from_settings(Settings.load(ws, env=env))  # the migrated container
    try:
        claims.register("s1", ["k1"], at=datetime.now(UTC))
        assert claims.read("k1") is not None
    finally:
        claims.close()

    store = DeltaDocumentStore(cosmos_settings.table_uri)
    v = store.save([DocumentWrite(DocumentRow("d1", "t", 1, {}, 2, 0, []), 0, store.version())])
    ts = int(store.delta_table.history(1)[0]["timestamp"])
    later = datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(seconds=31)
    monkeypatch.setattr("outbox.app.cli.rescue.SystemClock", lambda: ManualClock(later))
    rescued = runner.invoke(main, ["-w", ws, "rescue", "--json", "--delay", "30s"], env=env)
    assert rescued.exit_code == 0, rescued.output
    assert _json(rescued.output)["checkpoint_after"] == v

    settings = Settings.load(ws, env=env)
    backends = Backends(settings)
    cosmos = backends.checkpoint_store()
    assert isinstance(cosmos, CosmosCheckpointStore)
    [cp] = cosmos.list()
    assert (cp.table_uri, cp.rescuer_name, cp.version) == (store.uri, "default", v)
    sql = SqlCheckpointStore(settings.sql_url)
    assert sql.list() == []  # nothing went to the SQL table
    sql.close()

    status = runner.invoke(main, ["-w", ws, "status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    report = _json(status.output)
    assert report["checkpoint_store"].startswith(f"cosmos {cosmos_settings.cosmos_endpoint}")
    assert [c["version"] for c in report["checkpoints"]] == [v]

    # the log-trim and vacuum guard holds history for the Cosmos checkpoint
    assert oldest_needed_version(settings.sql_url, store.uri, settings=settings) == v + 1
    assert oldest_needed_version(settings.sql_url, store.uri) is None  # the SQL table is empty

    forget = ["-w", ws, "rescue", "--name", "default", "--forget", "--yes", "--json"]
    gone = runner.invoke(main, forget, env=env)
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.output)["forgot"] is True
    assert cosmos.list() == []
    backends.close()
    store.close()
    cosmos_client.delete_database(db)


def test_migrate_reports_a_container_with_another_partition_key(
    cosmos_settings: Settings, cosmos_client: Any
) -> None:
    from azure.cosmos import PartitionKey

    db = cosmos_settings.cosmos_database
    cosmos_client.create_database(db).create_container(
        "checkpoints", partition_key=PartitionKey(path="/table_uri")
    )
    result = CliRunner().invoke(
        main, ["-w", str(cosmos_settings.workspace), "migrate"], env=_env(cosmos_settings)
    )
    assert result.exit_code != 0
    assert "partitioned on ['/table_uri']" in result.output
    assert "left unchanged" in result.output
    cosmos_client.delete_database(db)


def test_an_unreachable_account_is_one_line_naming_the_endpoint(tmp_path: Path) -> None:
    endpoint = f"https://127.0.0.1:{free_port()}"
    env = {
        "OUTBOX_CHECKPOINT_STORE": "cosmos",
        "OUTBOX_COSMOS_ENDPOINT": endpoint,
        "OUTBOX_COSMOS_KEY": "a2V5",
    }
    forget = ["-w", str(tmp_path / "ws"), "rescue", "--name", "default", "--forget", "--yes"]
    result = CliRunner().invoke(main, forget, env=env)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert endpoint in lines[0]
    assert "OUTBOX_COSMOS_ENDPOINT" in lines[0]
    with pytest.raises(CheckpointUnavailableError) as caught:
        make_client(
            endpoint, "a2V5", unavailable=CheckpointUnavailableError, failed=CheckpointError
        )
    assert caught.value.retryable


def test_a_missing_container_says_run_migrate(cosmos_settings: Settings) -> None:
    store = CosmosCheckpointStore.from_settings(cosmos_settings)  # nothing provisioned
    with pytest.raises(CheckpointError, match="outbox migrate"):
        store.read("t", "r")
    store.close()


def test_missing_azure_cosmos_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.cosmos", None)  # import fails as if not installed
    settings = Settings(checkpoint_store="cosmos", cosmos_endpoint="https://127.0.0.1:1")
    with (
        pytest.raises(MissingDependencyError, match=r"pip install 'delta-outbox\[azure\]'"),
        Backends(settings) as backends,
    ):
        backends.checkpoint_store()


def test_cosmos_settings_are_validated_and_the_key_never_printed() -> None:
    from outbox.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="cosmos_endpoint"):
        check(Settings(checkpoint_store="cosmos"))
    with pytest.raises(ConfigurationError, match="checkpoint_store"):
        check(Settings(checkpoint_store="redis"))
    s = Settings(cosmos_endpoint="https://a.documents.azure.com:443/", cosmos_key="secret")
    assert "secret" not in repr(s)
    assert s.to_dict()["cosmos_key"] == "***"
    assert s.checkpoint_store == "sql"

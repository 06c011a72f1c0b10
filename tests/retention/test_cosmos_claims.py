"""``outbox maintain`` prunes a Cosmos DB claim log too (``claim_retention``), on the local
Cosmos-protocol server: the claim finished eight days ago goes, the one finished yesterday and an
old claim still working stay; with the pruner's query broken (``tests.mutate``) the old one stays
and the test fails."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from dispatcher.claims.cosmos import CosmosClaimLog
from outbox.app.cli import main
from outbox.core.settings import Settings
from tests.claims.conftest import cosmos_client, cosmos_endpoint, cosmos_settings
from tests.mutate import mutated
from tests.retention.seeds import DAY, HOUR

__all__ = ["cosmos_client", "cosmos_endpoint", "cosmos_settings"]

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


def _prunes(cosmos_settings: Settings, cosmos_client: Any) -> bool:
    """Whether ``outbox maintain`` took the old finished claim (and only it)."""
    s = cosmos_settings
    env = {
        "OUTBOX_CLAIM_LOG": "cosmos",
        "OUTBOX_COSMOS_ENDPOINT": s.cosmos_endpoint,
        "OUTBOX_COSMOS_KEY": s.cosmos_key,
        "OUTBOX_COSMOS_DATABASE": s.cosmos_database,
    }
    ws = str(s.workspace)
    try:
        assert CliRunner().invoke(main, ["-w", ws, "migrate"], env=env).exit_code == 0
        claims = CosmosClaimLog.from_settings(Settings.load(ws, env=env))
        now = datetime.now(UTC)
        try:
            for key, at in (("old", now - 8 * DAY), ("young", now - DAY)):
                claims.claim(key, "east", lease=HOUR, at=at)
                claims.complete(key, "east", at=at)
            claims.claim("working", "east", lease=HOUR, at=now - 8 * DAY)
            result = CliRunner().invoke(main, ["-w", ws, "maintain", "--json"], env=env)
            assert result.exit_code == 0, result.output
            (item,) = [
                i
                for i in json.loads(result.stdout)["retention"]
                if i["setting"] == "claim_retention"
            ]
            assert claims.read("young") is not None
            assert claims.read("working") is not None
            return claims.read("old") is None and item["deleted"] == 1
        finally:
            claims.close()
    finally:
        cosmos_client.delete_database(s.cosmos_database)


def test_outbox_maintain_prunes_the_cosmos_claim_log(
    cosmos_settings: Settings, cosmos_client: Any
) -> None:
    assert _prunes(cosmos_settings, cosmos_client)


def test_with_its_pruner_disabled_the_old_claim_stays(
    cosmos_settings: Settings, cosmos_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, attr, broken = mutated(
        "dispatcher.claims.cosmos:CosmosClaimLog.prune",
        (("\"c.kind = 'claim' AND (", "\"c.kind = 'none' AND ("),),
    )
    monkeypatch.setattr(owner, attr, broken)
    assert not _prunes(cosmos_settings, cosmos_client)

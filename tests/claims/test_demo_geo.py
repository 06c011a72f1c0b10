"""``outbox demo geo``: the two-region story ends with every invariant held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.cli import main

pytestmark = pytest.mark.slow


def test_demo_geo_fails_over_and_every_invariant_holds(tmp_path: Path) -> None:
    ws = tmp_path / "geo"
    result = CliRunner().invoke(
        main,
        ["demo", "geo", "--workspace", str(ws), "--packages", "4", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["written"] == report["handled"] == 12
    assert report["handler_calls"] == {"east": 4, "west": 8}  # east failed after the first status
    assert report["copies_completed_unhandled"]["west"] == 4  # west's copies of the first status
    assert report["sends_missed_by_east"] == 8
    assert report["duplicate_effects"] == 0
    assert report["packages_in_order"] == 4
    assert all(report["invariants"].values())

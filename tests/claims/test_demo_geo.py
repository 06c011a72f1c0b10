"""``outbox demo geo``: the two-region story ends with every invariant held."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main

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


def test_a_broken_invariant_is_reported_and_exits_5(monkeypatch: pytest.MonkeyPatch) -> None:
    from outbox.app.demos import geo as demo_geo

    effects = demo_geo._Effects()
    handle = demo_geo._Effects.handler(effects, "west")

    class Msg:
        def __init__(self, mid: str, step: int) -> None:
            self.message_id = mid
            self.body = json.dumps({"package": "pkg-0000", "step": step}).encode()

    for mid, step in (("a", 1), ("c", 3), ("b", 2), ("b", 2)):  # out of order, then a repeat
        handle(Msg(mid, step))
    report = demo_geo.GeoDemoReport(workspace="ws", kept=False, packages=1)
    demo_geo._verify(report, effects, 1)
    assert report.invariants == {
        "every status handled (nothing lost)": True,
        "each handled once (no duplicate effect)": False,
        "in order per package, across regions": False,
    }
    monkeypatch.setattr(demo_geo, "run_geo_demo", lambda *_a, **_k: report)
    result = CliRunner().invoke(main, ["demo", "geo"])
    assert result.exit_code == 5
    assert "BROKEN" in result.output

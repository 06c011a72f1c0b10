"""``outbox demo`` tells a true story at any ``--packages`` (issue 17): each sentence it prints is
derived from what happened in the run, so a size at which the script would go wrong (too few
packages for a mid-batch kill, so many that the save outlasts the rescue delay) still reads
true."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox import demo
from outbox.cli import main

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        if line and not line.startswith((">", "#", "field ")):
            name, _, value = line.partition("  ")
            rows[name.strip()] = value.strip()
    return rows


def test_the_smallest_demo_is_killed_mid_batch_and_rescued(tmp_path: Path) -> None:
    """Three packages: the send batch shrinks to one message, so the kill between the second and
    the third batch happens and leaves a message for the rescuer (with a fixed batch of eight
    there was one batch, no kill, and yet "I5 bounded rescue held")."""
    result = subprocess.run(
        [OUTBOX, "demo", "--packages", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OUTBOX_WORKSPACE": str(tmp_path / "unused")},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    steps = [ln[2:] for ln in result.stdout.splitlines() if ln.startswith("> ")]
    assert steps[2] == (
        "hub scanner (a separate process) saves 'arrived Charlotte' for all 3 packages in one "
        "commit and sends them 1 at a time; its dispatcher will be SIGKILLed between the second "
        "and the third send batch"
    )
    assert steps[3] == (
        "the hub scanner was SIGKILLed: 3 packages still hold 3 unsent (or unrecorded) messages"
    )
    assert steps[4].startswith("rescuer pass 1 (now): 0 ProcessDocument commands enqueued; ")
    assert steps[4].endswith(
        "old, under the 15s rescue delay, so the rescuer leaves it to its dispatcher (a live one "
        "would still be sending)"
    )
    assert steps[5].startswith("rescuer pass 2 (clock moved 16s forward, SIMULATED): ")
    rows = _rows(result.stdout)
    assert rows["dispatcher killed at"] == "mid_batch@2=kill (exit -9; 1 messages per send batch)"
    assert int(rows["rescued by the worker"]) >= 1  # the third message was never sent
    assert rows["I5 bounded rescue"] == "held"
    assert rows["delivered (distinct)"] == "9"
    assert "Traceback" not in result.stderr


def test_a_save_that_outlasts_the_rescue_delay_is_told_as_it_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``--packages 2000`` does (the hub scanner's save takes longer than the 15 s delay),
    made cheap: the demo's clock jumps past the delay while the hub scanner runs. Pass 1 then
    enqueues the commands, and the demo says so instead of "it leaves the live dispatcher
    alone"; no second pass, no simulated seconds."""
    real_hub_scan = demo._hub_scan

    def slow_hub_scan(story: Any, ws: Path) -> None:
        real_hub_scan(story, ws)
        story.clock.skipped += story.ob.settings.rescue_delay + 5

    monkeypatch.setattr(demo, "_hub_scan", slow_hub_scan)
    caplog.set_level(logging.INFO, logger="outbox.demo")
    ws = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "-w", str(ws), "--packages", "4", "--json"])
    assert result.exit_code == 0, result.output
    steps = [r.getMessage() for r in caplog.records if r.name == "outbox.demo"]
    report = json.loads(result.stdout)
    [first] = report["rescue_passes"]
    assert first["commands_enqueued"] == 4
    (pass_1,) = [s for s in steps if s.startswith("rescuer pass")]
    assert pass_1.startswith("rescuer pass 1 (now): the hub scanner's commit is already ")
    assert pass_1.endswith(
        "old, past the 15s rescue delay, so its dispatcher counts as gone: 4 documents examined, "
        f"4 ProcessDocument commands enqueued, checkpoint -> version {first['checkpoint_after']}"
        " (no clock was moved)"
    )
    assert sorted(report["invariants"]) == [  # the one --json key style
        "i1_no_loss",
        "i2_order",
        "i3_no_phantom",
        "i4_no_interference",
        "i5_bounded_rescue",
        "i6_idempotence",
    ]
    assert report["simulated_s"] == 0
    assert report["ok"] is True
    assert report["not_exercised"] == {}
    fields = {k: v for k, v in report.items() if k not in ("ok", "invariants")}
    rows = dict(demo.iter_rows(demo.DemoReport(**fields, invariants={"I5 bounded rescue": True})))
    assert rows["max rescue latency"].endswith("s (none simulated; rescue delay 15s)")
    assert rows["I5 bounded rescue"] == "held"


def test_geo_failover_is_timed_from_the_failure_not_from_wests_first_handling() -> None:
    """With many packages west handles some copies of the first status before east fails (they
    fall due while the save is still running): the failover is west's first handling *after*
    the failure, never a negative number; none at all is said in words."""
    import time

    from outbox import demo_geo

    class Msg:
        def __init__(self, mid: str, step: int) -> None:
            self.message_id = mid
            self.body = json.dumps({"package": "pkg-0000", "step": step}).encode()

    effects = demo_geo._Effects()
    west = effects.handler("west")
    west(Msg("a", 1))  # before the failure
    assert effects.first_after_failure == {}
    effects.failed_at = time.monotonic()
    west(Msg("b", 2))
    assert effects.first_after_failure["west"] >= effects.failed_at
    report = demo_geo.GeoDemoReport(workspace="ws", kept=False, packages=1)
    assert dict(demo_geo.iter_rows(report))["failover"] == (
        "east failed; west handled nothing after that"
    )
    report.failover_s = 1.5
    assert dict(demo_geo.iter_rows(report))["failover"] == (
        "east failed; west handled its next update 1.5s later"
    )

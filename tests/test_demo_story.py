"""``outbox demo`` tells a true story at any ``--packages`` (issue 17): each sentence it prints is
derived from what happened in the run, so a size at which the script would go wrong (too few
packages for a mid-batch kill, so many that the saves outlast the rescue delay) still reads
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

from outbox.app.cli import main
from outbox.app.demos import shipments as demo

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.splitlines():
        if line and not line.startswith((">", "#", "field ")):
            name, _, value = line.partition("  ")
            rows[name.strip()] = value.strip()
    return rows


@pytest.mark.slow  # seconds each: left out of the fast lane
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
    assert steps[4].startswith(
        "rescuer pass 1 (now): 0 ProcessDocument commands enqueued; no commit is 15s old yet "
        "(the hub scanner's is "
    )
    assert steps[4].endswith(
        "s old), so it leaves the hub scanner's documents to their dispatcher (a live one would "
        "still be sending)"
    )
    assert steps[5].startswith("rescuer pass 2 (clock moved 16s forward, SIMULATED): ")
    rows = _rows(result.stdout)
    assert rows["dispatcher killed at"] == "mid_batch@2=kill (exit -9; 1 messages per send batch)"
    assert int(rows["rescued by the worker"]) >= 1  # the third message was never sent
    assert rows["I5 bounded rescue"] == "held"
    assert rows["delivered (distinct)"] == "9"
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_a_save_that_outlasts_the_rescue_delay_is_told_as_it_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``--packages 2000`` does (the saves take longer than the 15 s delay), made cheap: the
    demo's clock jumps past the delay while the hub scanner runs. The first pass (no checkpoint)
    then sweeps the table as it is now and enqueues the hub scanner's documents too, and the
    demo says so instead of "it leaves the live dispatcher alone"; no second pass, no simulated
    seconds."""
    from rescuer.window import commit_times

    real_hub_scan = demo._hub_scan
    ages: dict[str, float] = {}

    def slow_hub_scan(story: Any, ws: Path) -> None:
        real_hub_scan(story, ws)
        # Move the clock so the table's creation is past the delay and the hub scanner's commit
        # (a second or more later: a new Python process) is not, as after 2,000 packages.
        latest = story.ob.store.refresh()
        times = {c.version: c.timestamp for c in commit_times(story.ob.store.delta_table, 999)}
        created, hub = times[0], times[story.hub_version]
        assert latest >= story.hub_version
        now = story.clock.now()
        story.clock.skipped += story.ob.settings.rescue_delay - (now - created).total_seconds()
        story.clock.skipped += (hub - created).total_seconds() / 2
        ages["hub"] = (story.clock.now() - hub).total_seconds()

    monkeypatch.setattr(demo, "_hub_scan", slow_hub_scan)
    caplog.set_level(logging.INFO, logger="outbox.app.demos.shipments")
    ws = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "-w", str(ws), "--packages", "4", "--json"])
    assert result.exit_code == 0, result.output
    steps = [r.getMessage() for r in caplog.records if r.name == "outbox.app.demos.shipments"]
    report = json.loads(result.stdout)
    [first] = report["rescue_passes"]
    assert first["commands_enqueued"] == 4
    (pass_1,) = [s for s in steps if s.startswith("rescuer pass")]
    assert pass_1.startswith(
        "rescuer pass 1 (now): no checkpoint yet, and commits past the 15s rescue delay exist, "
        "so it sweeps the table as it is now, the hub scanner's commit ("
    )
    assert pass_1.endswith(
        "s old) included: 4 documents examined, 4 ProcessDocument commands enqueued, checkpoint "
        f"-> version {first['checkpoint_after']}; no clock to move"
    )
    assert sorted(report["invariants"]) == [  # the one --json key style
        "i1_no_loss",
        "i2_order",
        "i3_no_phantom",
        "i4_no_interference",
        "i5_bounded_rescue",
        "i6_idempotence",
    ]
    assert ages["hub"] < 15  # the sweep took a commit younger than the delay
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

    from outbox.app.demos import geo as demo_geo

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


def test_geo_waits_while_there_is_progress_and_names_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large ``demo geo`` is slow, not lost: the wait gives up only when nothing moves for
    ``DEADLINE`` (it used to give up after 45 s in all and report the unhandled rest as lost)."""
    from outbox.app.demos import geo as demo_geo

    monkeypatch.setattr(demo_geo, "DEADLINE", 0.2)
    report = demo_geo.GeoDemoReport(workspace="ws", kept=False, packages=1)
    polls = [0]

    def moving() -> int:
        polls[0] += 1
        return polls[0]

    demo_geo._wait(lambda: polls[0] >= 10, report, "every status handled", moving)  # ~0.5 s
    assert report.problems == []
    demo_geo._wait(lambda: False, report, "every west copy settled", lambda: 0)
    assert report.problems == [
        "timed out waiting for every west copy settled (no progress for 0.2s)"
    ]


def test_the_devices_story_says_so_when_the_online_devices_were_not_done(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The devices story printed "the others are done" and "every device acked every task"
    whatever happened; now each is derived (here: the first wait gives up at once)."""
    from outbox.app.demos import devices as demo_devices
    from outbox.testing.mosquitto import mosquitto_binary

    if mosquitto_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is not installed; scripts/test.sh installs it")
        pytest.skip("mosquitto is not installed here (scripts/ensure-mosquitto.sh installs it)")
    real_wait = demo_devices._wait
    waits = [0]

    def first_gives_up(done: Any) -> bool:
        waits[0] += 1
        return False if waits[0] == 1 else real_wait(done)

    monkeypatch.setattr(demo_devices, "_wait", first_gives_up)
    caplog.set_level(logging.INFO, logger="outbox.app.demos.shipments")
    result = CliRunner().invoke(main, ["demo", "devices", "--json"])
    assert result.exit_code == 5, result.output
    steps = [r.getMessage() for r in caplog.records if r.name == "outbox.app.demos.shipments"]
    assert steps[2].startswith("the others are NOT done (timed out); door-")
    assert json.loads(result.stdout)["problems"] == ["timed out waiting for the online devices"]


def test_a_run_without_a_kill_does_not_claim_a_rescue() -> None:
    """Should the hub scanner ever finish before its crash point, the summary says so: no
    "killed at", no latency, and I5 "not exercised" instead of "held"."""
    report = demo.DemoReport("ws", False, 3, killed_at=demo.CRASH, dispatcher_exit=0, send_batch=1)
    report.invariants = {"I1 no loss": True, "I5 bounded rescue": True}
    report.not_exercised["I5 bounded rescue"] = "the crash left no message unsent to rescue"
    rows = dict(demo.iter_rows(report))
    assert rows["dispatcher killed at"] == "not killed: exited with 0 before mid_batch@2=kill"
    assert rows["max rescue latency"] == "- (nothing rescued)"
    assert rows["I5 bounded rescue"] == (
        "not exercised: the crash left no message unsent to rescue"
    )
    assert rows["I1 no loss"] == "held"

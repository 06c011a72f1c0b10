"""``outbox devices list|show``: per device, its presence and since when, the task out with its
tries, last try and next try, the queue behind it and the failed tasks, read from the gateway's
queue (no broker needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from dispatcher.queue import QueueMessage, SqlQueue
from dispatcher.queue.sessions import StateChange
from migrations.sql import upgrade
from outbox.app.cli import main
from outbox.core.clock import ManualClock

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    url = f"sqlite:///{ws / 'outbox.db'}"
    upgrade(url)
    clock = ManualClock(T0)
    with SqlQueue(url, clock=clock, lock_duration=10) as queue:
        queue.send(
            "devices",
            [QueueMessage(b"{}", message_id=f"a{i}", session_id="door-a") for i in range(3)]
            + [QueueMessage(b"{}", message_id=f"b{i}", session_id="door-b") for i in range(2)]
            + [QueueMessage(b"{}", message_id="c0", session_id="door-c")],
        )
        queue.sessions.set_states(
            "devices",
            [StateChange("door-a", paused=False, state="online"),
             StateChange("door-c", paused=True, state="offline")],
        )  # fmt: skip
        clock.advance(60)
        held = {m.session_id: m for m in queue.receive("devices", 10)}  # a gateway's view
        assert set(held) == {"door-a", "door-b"}, "nothing goes to the offline door-c"
        queue.dead_letter(held["door-b"], "DeviceDidNotAck", "no ack after 5 publishes")
    return ws


def test_list_and_show_tell_in_flight_queued_and_failed(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["device"]: r for r in json.loads(result.output)}
    a, b, c = rows["door-a"], rows["door-b"], rows["door-c"]
    assert (a["presence"], a["since"]) == ("online", T0.isoformat())
    assert (a["in_flight"], a["tries"]) == ("a0", 1)
    tried = T0 + timedelta(seconds=60)
    assert (a["last_try"], a["next_try"]) == (
        tried.isoformat(),
        (tried + timedelta(seconds=10)).isoformat(),
    )
    assert (a["queued"], a["next_task"], a["failed"]) == (2, "a1", 0)
    assert (b["presence"], b["in_flight"], b["queued"], b["next_task"], b["failed"]) == (
        "unknown",
        None,
        1,
        "b1",
        1,
    )
    assert (c["presence"], c["in_flight"], c["queued"], c["tries"]) == ("offline", None, 1, 0)

    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "show", "door-b", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [(f["message_id"], f["reason"]) for f in shown["failed_tasks"]] == [
        ("b0", "DeviceDidNotAck")
    ]
    shown = json.loads(
        CliRunner().invoke(main, ["-w", str(ws), "devices", "show", "door-a", "--json"]).output
    )
    assert [(t["message_id"], t["state"], t["tries"]) for t in shown["tasks"]] == [
        ("a0", "out", 1),
        ("a1", "waiting", 0),
        ("a2", "waiting", 0),
    ]

    plain = CliRunner().invoke(main, ["-w", str(ws), "devices", "list"])
    assert plain.exit_code == 0
    lines = plain.output.splitlines()
    assert lines[0] == "# devices on devices"
    assert lines[1].split() == [
        "device", "presence", "since", "task", "out", "tries", "last", "try", "next", "try",
        "queued", "failed",
    ]  # fmt: skip
    assert lines[2].split()[:5] == ["door-a", "online", T0.isoformat(timespec="seconds"), "a0", "1"]


def test_an_unknown_device_is_an_error_and_a_missing_workspace_is_one_line(
    tmp_path: Path,
) -> None:
    """A device nothing is known of is a typo until shown otherwise: one line, exit 1, and the
    closest known name, instead of an empty device that reads as all clear."""
    ws = _workspace(tmp_path)
    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "show", "dor-b", "--json"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        "error: device 'dor-b' is unknown on queue 'devices' (did you mean 'door-b'?): it has "
        "no task, no failed task and no recorded presence there (fix: list the devices with "
        "`outbox devices list --destination devices`)\n"
    )
    missing = CliRunner().invoke(main, ["-w", str(tmp_path / "none"), "devices", "list"])
    assert missing.exit_code == 1
    assert missing.output.count("\n") == 1
    assert "outbox migrate" in missing.output

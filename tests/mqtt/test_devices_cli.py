"""``outbox devices list|show``: per device, the task in flight, the queue behind it and the
failed tasks, read from the gateway's queue (no broker needed)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.app.cli import main


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    url = f"sqlite:///{ws / 'outbox.db'}"
    upgrade(url)
    with SqlQueue(url) as queue:
        queue.send(
            "devices",
            [QueueMessage(b"{}", message_id=f"a{i}", session_id="door-a") for i in range(3)]
            + [QueueMessage(b"{}", message_id=f"b{i}", session_id="door-b") for i in range(2)],
        )
        held = {m.session_id: m for m in queue.receive("devices", 10)}  # a gateway's view
        queue.dead_letter(held["door-b"], "DeviceDidNotAck", "no ack after 5 publishes")
    return ws


def test_list_and_show_tell_in_flight_queued_and_failed(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["device"]: r for r in json.loads(result.output)}
    assert rows["door-a"]["in_flight"] == "a0"
    assert rows["door-a"]["deliveries"] == 1
    assert (rows["door-a"]["queued"], rows["door-a"]["next_task"]) == (2, "a1")
    assert rows["door-a"]["failed"] == 0
    assert rows["door-b"]["in_flight"] is None
    assert (rows["door-b"]["queued"], rows["door-b"]["next_task"]) == (1, "b1")
    assert rows["door-b"]["failed"] == 1

    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "show", "door-b", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [(f["message_id"], f["reason"]) for f in shown["failed_tasks"]] == [
        ("b0", "DeviceDidNotAck")
    ]

    plain = CliRunner().invoke(main, ["-w", str(ws), "devices", "list"])
    assert plain.exit_code == 0
    lines = plain.output.splitlines()
    assert lines[0] == "# devices of devices"
    assert lines[1].split() == [
        "device",
        "in",
        "flight",
        "deliveries",
        "waiting",
        "since",
        "queued",
        "next",
        "failed",
    ]
    assert lines[2].startswith("door-a  ")


def test_an_unknown_device_is_shown_empty_and_a_missing_workspace_is_one_line(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path)
    result = CliRunner().invoke(main, ["-w", str(ws), "devices", "show", "nobody", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["in_flight"] is None
    missing = CliRunner().invoke(main, ["-w", str(tmp_path / "none"), "devices", "list"])
    assert missing.exit_code == 1
    assert missing.output.count("\n") == 1
    assert "outbox migrate" in missing.output

"""The queue and dead-letter commands, on a SQLite workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.app.cli import main


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    upgrade(f"sqlite:///{ws / 'outbox.db'}")
    queue = SqlQueue(f"sqlite:///{ws / 'outbox.db'}", max_delivery_count=1)
    queue.send("orders", [QueueMessage(f"body {i}", message_id=f"m{i}") for i in range(5)])
    for m in queue.receive("orders", 3):
        queue.dead_letter(m, "Bad" if m.message_id != "m2" else "Other", "why")
    queue.close()
    return ws


def run(ws: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-w", str(ws), *args])
    return result.exit_code, result.output


def test_stats_and_peek(ws: Path) -> None:
    code, out = run(ws, "queue", "stats", "--json")
    assert code == 0
    assert json.loads(out) == [  # the shape of `status --json`'s "queues"
        {
            "queue": "orders",
            "active": 2,
            "scheduled": 0,
            "locked": 0,
            "deferred": 0,
            "dead_lettered": 3,
        }
    ]
    code, out = run(ws, "queue", "peek", "orders", "--limit", "1", "--json")
    [m] = json.loads(out)
    assert (m["message_id"], m["state"], m["body"]) == ("m3", "active", "body 3")
    code, out = run(ws, "queue", "peek", "orders")
    assert code == 0
    assert "m4" in out


def test_dead_letters_commands(ws: Path) -> None:
    code, out = run(ws, "dead-letters", "list", "--json")
    items = json.loads(out)
    assert [d["message_id"] for d in items] == ["m0", "m1", "m2"]
    code, out = run(ws, "dead-letters", "show", str(items[0]["id"]), "--json")
    assert json.loads(out)["reason"] == "Bad"
    code, out = run(ws, "dead-letters", "requeue", "--where", "reason=Other", "--json")
    assert json.loads(out) == {"requeued": 1}
    code, out = run(ws, "dead-letters", "purge", "--all", "--yes")  # no terminal to ask
    assert (code, out.strip()) == (0, "purged 2 dead letter(s)")
    code, out = run(ws, "dead-letters", "list")
    assert "m0" not in out


def test_errors_are_one_line(ws: Path, tmp_path: Path) -> None:
    code, out = run(ws, "dead-letters", "show", "999")
    assert code == 1
    assert "no dead letter has id 999" in out
    code, out = run(ws, "dead-letters", "requeue")
    assert code == 1
    assert "exactly one" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = run(empty, "queue", "stats")
    assert code == 1
    assert "outbox migrate" in out
    assert len(out.strip().splitlines()) == 1

"""``outbox keys list`` / ``outbox keys resume`` and the paused keys in ``outbox status``: what an
operator sees of a key a failed send paused, and how one resumes it (through the CLI)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from dispatcher.queue.key_lines import SqlKeyLines, Wait
from dispatcher.queue.sql_queue import SqlQueue
from outbox.app.cli import main
from outbox.app.facade import Outbox


def _paused(tmp_path: Path) -> Path:
    """A workspace whose key q/customer-7 is paused at A-1, with B-1 and C-1 behind it."""
    ws = tmp_path / "ws"
    Outbox.open(ws, transport="memory").close()
    queue = SqlQueue(f"sqlite:///{ws / 'outbox.db'}")
    try:
        SqlKeyLines(queue.database).hold(
            [Wait(("q", "customer-7"), d, "life", 1, f"{d}-1") for d in "ABC"],
            "broker down",
            datetime(2026, 1, 1, tzinfo=UTC),
        )
    finally:
        queue.close()
    return ws


def _cli(ws: Path, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["-w", str(ws), *args])
    return r.exit_code, r.stdout, r.stderr


def test_list_shows_the_gate_since_when_why_and_how_many_wait(tmp_path: Path) -> None:
    ws = _paused(tmp_path)
    code, out, _ = _cli(ws, "keys", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "# paused ordering keys"
    assert lines[1].split() == [
        "destination",
        "key",
        "waits",
        "for",
        "document",
        "seq",
        "paused",
        "for",
        "held",
        "why",
    ]
    assert lines[2].split()[:5] == ["q", "customer-7", "A-1", "A", "1"]
    assert lines[2].split()[-3:] == ["2", "broker", "down"]
    code, out, _ = _cli(ws, "keys", "list", "--json")
    (key,) = json.loads(out)
    assert {k: key[k] for k in ("destination", "ordering_key", "waits_for_message", "held")} == {
        "destination": "q",
        "ordering_key": "customer-7",
        "waits_for_message": "A-1",
        "held": 2,
    }
    assert key["age_s"] > 0
    assert key["reason"] == "broker down"


def test_status_counts_and_lists_the_paused_keys(tmp_path: Path) -> None:
    ws = _paused(tmp_path)
    code, out, _ = _cli(ws, "status", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["paused_key_count"] == 1
    assert report["paused_keys"][0]["waits_for_message"] == "A-1"
    _, text, _ = _cli(ws, "status")
    assert "1 paused ordering key(s)" in text


def test_resume_skips_the_named_gate_once_or_opens_the_key(tmp_path: Path) -> None:
    ws = _paused(tmp_path)
    code, out, _ = _cli(ws, "keys", "resume", "q", "customer-7", "--skip", "A-1")
    assert (code, out.strip()) == (
        0,
        "q/customer-7: gave up on A-1; the next held document goes next",
    )
    code, out, _ = _cli(ws, "keys", "resume", "q", "customer-7", "--skip", "A-1")
    assert "nothing to do" in out  # the gate is B-1 now: a repeat skips nothing
    _, out, _ = _cli(ws, "keys", "list", "--json")
    assert json.loads(out)[0]["waits_for_message"] == "B-1"
    code, out, _ = _cli(ws, "keys", "resume", "q", "customer-7", "--open", "--json")
    assert json.loads(out)["resumed"] is True
    assert _cli(ws, "keys", "list")[1].strip() == "no paused ordering keys"


def test_resume_without_saying_how_is_one_line(tmp_path: Path) -> None:
    ws = _paused(tmp_path)
    code, out, err = _cli(ws, "keys", "resume", "q", "customer-7")
    assert code == 1
    assert out == ""
    assert err.strip().splitlines() == [
        "error: say how to resume the key: --skip MESSAGE_ID (the gate `outbox keys list` shows) "
        "or --open (fix: e.g. outbox keys resume q customer-7 --skip <message id>)"
    ]

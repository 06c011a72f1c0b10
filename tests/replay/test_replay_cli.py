"""``outbox replay`` end to end through the CLI on the embedded default (the SQL queue on SQLite):
a dry run's counts, a replay whose worker dies in the middle and is run again, a planner that
dies and is resumed, new ids that are the same on every try, and the replays in ``outbox
status``.

The history (``helpers.build_history``) is dispatched nowhere, so each save repeats the messages
of the saves before it: the dry run counts only those first committed in the range."""

from __future__ import annotations

from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher import runtime as runtime_module
from dispatcher.replay_handler import REPLAY_HEADER, replayed_id
from outbox.app import replay as replay_module
from outbox.core.clock import SystemClock
from outbox.testing.crash_points import InjectedCrash, crash_points
from tests.replay.helpers import History, build_history, cli, cli_json, delivered


@pytest.fixture
def history(tmp_path: Path) -> History:
    return build_history(tmp_path / "ws")


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The CLI's clock moved on (no sleep): past a crashed worker's locks (``lock_duration``,
    30 s), inside the queue's duplicate-detection window (10 minutes)."""
    real = SystemClock.now
    monkeypatch.setattr(SystemClock, "now", lambda self: real(self) + timedelta(seconds=seconds))


def test_the_dry_run_counts_the_messages_first_committed_in_the_range(history: History) -> None:
    h = history
    out = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c), "--dry-run")
    assert (out["from_version"], out["to_version"], out["dry_run"]) == (h.b, h.c, True)
    # b: d0..d4 Moved + Billed; c: d10, d11 Created and d5 Moved. Not the Created of d0..d5 that
    # the rows of b and c repeat (committed in a, before the range).
    assert out["by_destination_type"] == [
        {"destination": "billing", "type": "Billed", "messages": 5},
        {"destination": "shipments", "type": "Created", "messages": 2},
        {"destination": "shipments", "type": "Moved", "messages": 6},
    ]
    assert (out["messages"], out["documents"]) == (13, 8)
    whole = cli_json(h.ws, "replay", "--from", "0", "--to", str(h.c), "--dry-run")
    assert whole["messages"] == len(h.ids) == 23  # each message once, however many rows hold it
    only = cli_json(
        h.ws,
        "replay",
        "--from", str(h.b), "--to", str(h.c),
        "--where", "id = 'd5'",
        "--destination", "shipments",
        "--dry-run",
    )  # fmt: skip
    assert only["by_destination_type"] == [
        {"destination": "shipments", "type": "Moved", "messages": 1}
    ]
    text = cli(h.ws, "replay", "--from", str(h.b), "--to", str(h.c), "--dry-run")
    assert text.exit_code == 0, text.output
    assert "dry run: nothing sent" in text.stdout
    assert [line.split() for line in text.stdout.splitlines() if "Billed" in line] == [
        ["billing", "Billed", "5"]
    ]
    assert delivered(h.ws) == []  # a dry run sends nothing and records nothing
    assert cli_json(h.ws, "replay", "--status")["replays"] == []


def _run_until_idle(ws: Path) -> None:
    result = cli(ws, "run-dispatcher", "--until-idle", "--poll-interval", "10ms")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("new_ids", [False, True], ids=["own-ids", "new-ids"])
def test_a_replay_survives_a_worker_crash_and_delivers_every_message_once(
    history: History, monkeypatch: pytest.MonkeyPatch, new_ids: bool
) -> None:
    h = history
    monkeypatch.setattr(replay_module, "CHUNK_MESSAGES", 2)  # several chunks
    monkeypatch.setattr(runtime_module, "DEFAULT_MAX_BATCH_MESSAGES", 2)  # several sends
    flags = ["--new-ids"] if new_ids else []
    started = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c), *flags)
    rid = started["replay_id"]
    assert (started["status"], started["messages"], started["sent_chunks"]) == ("enqueued", 13, 0)
    chunks = started["chunks"]
    assert chunks >= 4
    assert started["enqueued_chunks"] == chunks

    crash_points.arm("mid_batch", at_hit=3)  # the third send went out, its chunks not recorded
    try:
        with pytest.raises(InjectedCrash):
            cli(h.ws, "run-dispatcher", "--until-idle", "--poll-interval", "10ms")
    finally:
        crash_points.disarm()
    mid = cli_json(h.ws, "replay", "--status")["replays"][0]
    assert (mid["replay_id"], mid["status"]) == (rid, "enqueued")
    assert 0 < mid["sent_chunks"] < chunks  # those the first two sends finished

    _later(monkeypatch, 120)  # the dead worker's locks have expired
    _run_until_idle(h.ws)
    done = cli_json(h.ws, "replay", "--status")["replays"][0]
    assert (done["status"], done["sent_chunks"], done["sent_messages"]) == ("done", chunks, 13)

    expected = h.committed(h.b, h.c)
    got = delivered(h.ws)
    # every message of the range, once: the third chunk went out twice with the same ids and the
    # queue dropped the repeat (new ids are as stable as the own ones)
    want = {replayed_id(rid, m) if new_ids else m: k for m, k in expected.items()}
    assert sorted(d["message_id"] for d in got) == sorted(want)
    assert {d["headers"][REPLAY_HEADER] for d in got} == {rid}
    # each document's messages in seq order
    seqs: dict[str, list[int]] = {}
    for d in got:
        doc, seq = want[d["message_id"]]
        assert d["session_id"] == doc
        seqs.setdefault(doc, []).append(seq)
    assert all(s == sorted(s) for s in seqs.values()), seqs
    assert {d["queue"] for d in got if want[d["message_id"]][1] == 3} == {"billing"}

    status = cli_json(h.ws, "status")
    assert [(r["replay_id"], r["status"]) for r in status["replays"]] == [(rid, "done")]


def test_a_planner_that_dies_is_resumed_and_enqueues_nothing_twice(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = history
    monkeypatch.setattr(replay_module, "CHUNK_MESSAGES", 1)
    monkeypatch.setattr(replay_module, "ENQUEUE_GROUP", 3)
    moved = replay_module.Replays._moved
    calls: list[int] = []

    def dies_at_the_second_group(self: Any, replay_id: str, cursor: int) -> None:
        calls.append(cursor)
        if len(calls) == 2:  # the second group is in the queue, the cursor not moved
            raise InjectedCrash("planner")
        moved(self, replay_id, cursor)

    monkeypatch.setattr(replay_module.Replays, "_moved", dies_at_the_second_group)
    with pytest.raises(InjectedCrash):
        cli(h.ws, "replay", "--from", str(h.b), "--to", str(h.c))
    monkeypatch.setattr(replay_module.Replays, "_moved", moved)
    [row] = cli_json(h.ws, "replay", "--status")["replays"]
    assert (row["status"], row["enqueued_chunks"], row["chunks"]) == ("planning", 3, 13)

    resumed = cli_json(h.ws, "replay", "--resume", row["replay_id"])
    assert (resumed["status"], resumed["enqueued_chunks"]) == ("enqueued", 13)
    _run_until_idle(h.ws)
    assert sorted(d["message_id"] for d in delivered(h.ws)) == sorted(h.committed(h.b, h.c))
    done = cli_json(h.ws, "replay", "--status")["replays"][0]
    assert (done["status"], done["sent_chunks"], done["sent_messages"]) == ("done", 13, 13)


def test_a_range_given_by_times_is_the_commits_between_them(history: History) -> None:
    h = history
    from outbox.app.replay_plan import commits
    from outbox.core.settings import Settings
    from outbox.wiring.backends import open_document_store

    store = open_document_store(Settings.load(h.ws))
    try:
        times = commits(store.delta_table)
    finally:
        store.close()
    # the first commit at or after --from, the last at or before --to
    start = times[h.b].astimezone(UTC).isoformat()
    end = times[h.c].astimezone(UTC).isoformat()
    out = cli_json(h.ws, "replay", "--from", start, "--to", end, "--dry-run")
    assert (out["from_version"], out["to_version"], out["messages"]) == (h.b, h.c, 13)
    naive = times[h.b].replace(tzinfo=None).isoformat()  # a naive time is UTC
    assert (
        cli_json(h.ws, "replay", "--from", naive, "--to", str(h.c), "--dry-run")["messages"] == 13
    )


def test_a_chunk_delivered_again_after_it_was_recorded_is_completed_without_a_send(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose command comes again once the queue has forgotten its id (past the
    duplicate-detection window): recorded as sent, so it is completed and nothing goes out."""
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.settings import Settings

    h = history
    rid = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c))["replay_id"]
    _run_until_idle(h.ws)
    before = delivered(h.ws)
    assert len(before) == 13
    sent = cli_json(h.ws, "replay", "--status")["replays"][0]
    _later(monkeypatch, 3600)  # the queue no longer drops the id as a repeat
    queue = SqlQueue.from_settings(Settings.load(h.ws), clock=SystemClock())
    try:
        [first] = [m for m in _chunk_commands(h, rid) if m.message_id == f"rp-{rid}-0"]
        assert queue.send("outbox-commands", first) == [first.message_id]  # taken again
    finally:
        queue.close()
    _run_until_idle(h.ws)
    assert delivered(h.ws) == before  # completed, not sent again
    assert cli_json(h.ws, "replay", "--status")["replays"][0] == sent


def _chunk_commands(h: History, rid: str) -> list[Any]:
    """The replay's commands as its planner made them (the same plan every time)."""
    from dispatcher.replay_handler import ReplayMessages
    from outbox.app.replay import ReplayRequest, plan_range
    from outbox.app.replay_plan import Range
    from outbox.core.settings import Settings
    from outbox.wiring.backends import open_document_store

    store = open_document_store(Settings.load(h.ws))
    try:
        plan = plan_range(store, Range(h.b, h.c), ReplayRequest(str(h.b), str(h.c)))
        return [
            ReplayMessages(
                store.table_id, rid, i, ch.bucket, ch.start, ch.end, ch.message_ids
            ).to_queue_message()
            for i, ch in enumerate(plan.chunks())
        ]
    finally:
        store.close()

"""Chunks share sends (as documents do in the dispatcher's coalesced path), so one chunk the
transport refuses must not hold back the others: a failed shared send falls back to a chunk at a
time, the refused chunk is dead-lettered alone and every other chunk is sent and recorded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.sql import SqlQueueTransport
from outbox.app import replay as replay_module
from outbox.core.errors import PermanentTransportError
from outbox.core.settings import Settings
from tests.replay.helpers import History, build_history, cli, cli_json, delivered


def test_a_refused_chunk_is_dead_lettered_alone_and_the_others_are_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h: History = build_history(tmp_path / "ws")
    monkeypatch.setattr(replay_module, "CHUNK_MESSAGES", 2)  # several chunks, one shared send
    started = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c))
    rid, chunks = started["replay_id"], started["chunks"]
    assert chunks >= 4
    poison = h.ids[("d5", 2)]  # d5's Moved, committed in c
    real = SqlQueueTransport.send

    def refuses_one(self: SqlQueueTransport, batch: Sequence[TransportMessage]) -> None:
        if any(m.message_id == poison for m in batch):
            raise PermanentTransportError(f"message {poison}: refused", message_id=poison)
        real(self, batch)

    monkeypatch.setattr(SqlQueueTransport, "send", refuses_one)
    result = cli(h.ws, "run-dispatcher", "--once")  # no wait for a backoff: what is ready now
    assert result.exit_code == 1, result.output  # one command not completed: the refused one
    assert "1 dead-lettered" in result.output

    queue = SqlQueue.from_settings(Settings.load(h.ws))
    try:
        [dead] = queue.list_dead_letters("outbox-commands")
    finally:
        queue.close()
    assert (dead.reason, dead.message_id.startswith(f"rp-{rid}-")) == (
        "PermanentTransportError",
        True,
    )
    row = cli_json(h.ws, "replay", "--status")["replays"][0]
    assert (row["status"], row["sent_chunks"]) == ("enqueued", chunks - 1)
    got = {d["message_id"] for d in delivered(h.ws)}
    expected = set(h.committed(h.b, h.c))
    assert poison not in got
    # every message but those of the refused chunk (d5's Moved, and its chunk-mate if any)
    assert got < expected
    assert len(expected - got) <= 2, sorted(expected - got)
    assert len(got) == row["sent_messages"]

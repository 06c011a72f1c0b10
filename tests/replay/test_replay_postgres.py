"""The replay's rows on PostgreSQL (the queue, its chunks and the trim's holders in the server's
database): a replay enqueued, sent by the worker, done, each message once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from outbox.core.sql import make_engine
from tests.replay.helpers import build_history, cli, cli_json


@pytest.mark.postgres
def test_a_replay_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "outbox.toml").write_text(f"sql_url = {json.dumps(pg_url)}\n")
    h = build_history(ws)
    started = cli_json(ws, "replay", "--from", str(h.b), "--to", str(h.c))
    assert (started["status"], started["messages"]) == ("enqueued", 13)

    from outbox.app.rescuer_history import oldest_needed_version
    from outbox.core.settings import Settings

    settings = Settings.load(ws)
    table_uri = settings.table_uri
    assert oldest_needed_version(settings.sql_url, table_uri, None, settings=settings) == h.a

    result = cli(ws, "run-dispatcher", "--until-idle", "--poll-interval", "10ms")
    assert result.exit_code == 0, result.output
    [done] = cli_json(ws, "replay", "--status")["replays"]
    assert (done["status"], done["sent_messages"]) == ("done", 13)
    assert oldest_needed_version(settings.sql_url, table_uri, None, settings=settings) is None
    engine = make_engine(pg_url)
    try:
        with engine.connect() as c:
            ids = c.execute(
                text(
                    "SELECT message_id FROM outbox_queue_messages "
                    "WHERE queue IN ('shipments', 'billing')"
                )
            ).scalars()
            assert sorted(ids) == sorted(h.committed(h.b, h.c))
    finally:
        engine.dispose()

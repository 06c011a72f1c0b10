"""A replay reads the retained history only, and holds it while it runs: an unfinished replay
keeps the log trim at the version before its range (as a lagging rescuer does), a finished one
lets it go, and a range the trim has passed is refused with one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from outbox.app.maintenance import trim_log_safely
from outbox.app.replay_status import holding_versions
from outbox.core.clock import ManualClock
from outbox.core.settings import Settings
from outbox.core.sql import make_engine
from outbox.wiring.backends import open_document_store
from tests.replay.helpers import build_history, cli, cli_json, more_versions


def _trim(ws: Path) -> dict[str, object]:
    """The writers' and ``outbox maintain``'s log trim, a day later (every commit is old)."""
    settings = Settings.load(ws)
    store = open_document_store(settings)
    try:
        return trim_log_safely(
            store,
            clock=ManualClock(datetime.now(UTC) + timedelta(days=1)),
            sql_url=settings.sql_url,
            retention_seconds=settings.log_retention,
            settings=settings,
        )
    finally:
        store.close()


def test_an_unfinished_replay_holds_the_log_trim_and_a_finished_one_lets_it_go(
    tmp_path: Path,
) -> None:
    h = build_history(tmp_path / "ws", checkpoint_after_a=True)
    latest = more_versions(h.ws, 3)  # checkpoints at c+1..c+3: the trim could keep from c+2
    rid = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c))["replay_id"]

    held = _trim(h.ws)
    # the replay reads the table as of b - 1 = a, where the checkpoint is
    assert (held["keep_from_version"], held["held_by"]) == (h.a, "rescuer")
    dry = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c), "--dry-run")
    assert dry["messages"] == 13  # its history is all there

    result = cli(h.ws, "run-dispatcher", "--until-idle", "--poll-interval", "10ms")
    assert result.exit_code == 0, result.output
    assert cli_json(h.ws, "replay", "--status")["replays"][0]["status"] == "done"
    freed = _trim(h.ws)
    assert freed["keep_from_version"] == latest - 1  # the newest but one checkpoint
    gone = cli(h.ws, "replay", "--from", str(h.b), "--to", str(h.c), "--dry-run")
    assert gone.exit_code == 1
    assert f"which begins at version {latest - 1}" in gone.stderr
    assert rid  # the finished replay is still listed


def test_an_unfinished_replay_holds_for_replay_retention_and_until_done_at_zero(
    tmp_path: Path,
) -> None:
    """A replay abandoned half-way holds the history for ``replay_retention`` after it started;
    ``replay_retention = 0`` keeps finished replays for ever, and an unfinished one then holds
    until it is done (not: not at all)."""
    h = build_history(tmp_path / "ws")
    cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(h.c))
    settings = Settings.load(h.ws)
    engine = make_engine(settings.sql_url)
    now = datetime.now(UTC)
    month = 30 * 24 * 3600.0
    try:
        uri = settings.table_uri
        assert holding_versions(engine, uri, None, now, month) == [h.a]
        later = now + timedelta(days=31)  # abandoned for longer than replay_retention
        assert holding_versions(engine, uri, None, later, month) == []
        assert holding_versions(engine, uri, None, later, 0) == [h.a]
    finally:
        engine.dispose()

"""``outbox replay``'s wrong uses through the CLI: one line each naming the problem and the fix,
no traceback, nothing recorded or sent."""

from __future__ import annotations

import pytest

from tests.replay.helpers import History, build_history, cli, cli_json, delivered, more_versions


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory: pytest.TempPathFactory) -> History:
    """The history with its oldest commits trimmed: it begins at a checkpoint after c."""
    from datetime import UTC, datetime, timedelta

    from outbox.delta.log import trim_log

    h = build_history(tmp_path_factory.mktemp("replay") / "ws")
    latest = more_versions(h.ws, 2)  # checkpoints at c+1 and c+2
    report = trim_log(
        str((h.ws / "documents").absolute()),
        now=datetime.now(UTC) + timedelta(days=1),
        retention=timedelta(minutes=15),
        needed=None,
    )
    assert report.keep_from == latest - 1 == h.c + 1
    return h


def _one_line(h: History, *args: str, code: int = 1) -> str:
    result = cli(h.ws, *args)
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in result.output
    return lines[0]


def test_a_reversed_range(trimmed: History) -> None:
    h = trimmed
    line = _one_line(h, "replay", "--from", str(h.c + 2), "--to", str(h.c + 1))
    assert line == (
        f"error: the replay range is reversed: --from is version {h.c + 2}, after --to version "
        f"{h.c + 1} (fix: swap them: --from names the older end of the range)"
    )


def test_a_range_before_the_retained_history(trimmed: History) -> None:
    h = trimmed
    line = _one_line(h, "replay", "--from", str(h.b), "--to", str(h.c + 2), "--dry-run")
    assert line == (
        f"error: version {h.b} is before the table's retained history, which begins at version "
        f"{h.c + 1} (older commits were trimmed: the log keeps log_retention = 15m00s, longer "
        "only while a rescuer or a replay holds it) (fix: replay from version "
        f"{h.c + 2} or later; to replay further back next time, raise log_retention)"
    )
    ok = cli_json(h.ws, "replay", "--from", str(h.c + 2), "--to", str(h.c + 2), "--dry-run")
    assert ok["messages"] == 0  # the oldest replayable range (a document without messages)


def test_an_unknown_replay_id(trimmed: History) -> None:
    line = _one_line(trimmed, "replay", "--resume", "nope")
    assert line == (
        "error: no replay 'nope' in this workspace's database (fix: `outbox replay --status` "
        "lists the replays and their ids)"
    )


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (
            ["--from", "3"],
            2,
            "error: a replay needs --from and --to (table versions or times), or --resume ID, "
            "or --status (see `outbox replay --help`)",
        ),
        (
            ["--resume", "x", "--new-ids"],
            2,
            "error: --resume goes on with the replay's own range and options; leave out "
            "--new-ids (see `outbox replay --help`)",
        ),
        (
            ["--from", "yesterday", "--to", "3"],
            1,
            "error: --from 'yesterday' is neither a table version nor a time (fix: give a "
            "version (e.g. 42) or an ISO 8601 time (e.g. 2026-11-29T10:00:00Z))",
        ),
        (
            ["--from", "0", "--to", "999"],
            1,
            "error: --to version 999 is past the table's newest version {latest} (fix: replay "
            "up to version {latest} at most)",
        ),
    ],
    ids=["no-to", "resume-with-options", "not-a-time", "past-the-newest"],
)
def test_a_malformed_request(trimmed: History, args: list[str], code: int, line: str) -> None:
    latest = trimmed.c + 2
    assert _one_line(trimmed, "replay", *args, code=code) == line.format(latest=latest)


def test_a_predicate_that_does_not_apply(trimmed: History) -> None:
    h = trimmed
    line = _one_line(
        h, "replay", "--from", str(h.c + 2), "--to", str(h.c + 2), "--where", "nosuch = 1"
    )
    assert line.startswith("error: --where 'nosuch = 1' cannot be applied to the table's rows: ")
    assert line.endswith(
        "(fix: write a SQL predicate over the document columns, e.g. \"type = 'Package'\")"
    )


def test_nothing_was_recorded_or_sent(trimmed: History) -> None:
    assert cli_json(trimmed.ws, "replay", "--status")["replays"] == []
    assert delivered(trimmed.ws) == []

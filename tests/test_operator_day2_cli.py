"""The operator's day, round 2 (issue 35), through the CLI: an ordinary environment problem or a
typo is one ``error:`` line with the documented exit code, never "unexpected ..., report it", a
usage block, a Rust backtrace or AWS's own warnings; a typo never reads as an empty success;
every duration option is one DURATION type; ``--json`` names every duration in seconds, ``_s``.

Paths in the expected lines are the test's own temporary folders (``{ws}``, ``{tmp}``); under
``CliRunner`` the command is called ``main``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from tests.workspaces import dispatched_workspace

BULK = 3000  # messages in the queue "bulk": far more lines than a reader of one line takes


def _send(ws: Path, queue: str, count: int = 1, *, ago: float = 0.0, **message: Any) -> None:
    """``count`` messages to ``queue``, enqueued ``ago`` seconds ago."""
    from datetime import UTC, datetime, timedelta

    from dispatcher.queue import QueueMessage, SqlQueue
    from outbox.core.clock import ManualClock

    clock = ManualClock(datetime.now(UTC) - timedelta(seconds=ago))
    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}", clock=clock) as q:
        q.send(
            queue,
            [QueueMessage(body=b"{}", message_id=f"{queue}-{i}", **message) for i in range(count)],
        )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A migrated workspace: one dispatched document, one message waiting in "shipments"."""
    path = dispatched_workspace(tmp_path / "ws")
    _send(path, "shipments")
    return path


def _binary_settings(ws: Path, tmp: Path) -> None:
    (tmp / "settings.bin").write_bytes(b"\xff\xfe\x00\x01binary\x00")


def _damaged_log(ws: Path, tmp: Path) -> None:
    (ws / "documents" / "_delta_log" / "00000000000000000000.json").write_text("{not json\n")


_GATEWAY = ["run-gateway", "mqtt", "--destination", "devices", "--broker", "mqtt://127.0.0.1:1"]
_EMPTY_PATH = "an empty path names no file or folder (leave the option out for the default)"

# (case id, argv after `main -w {ws}` (argv with its own -w: as given), setup(ws, tmp), exit, line)
CASES: list[tuple[str, list[str], Callable[[Path, Path], None] | None, int, str]] = [
    # --- item 3: ordinary environment problems, not "unexpected ..., report it" ---------------
    (
        "a binary settings file",
        ["--config", "{tmp}/settings.bin", "status"],
        _binary_settings,
        1,
        "error: settings file {tmp}/settings.bin is not a TOML text file: byte 0 is not UTF-8 "
        "(fix: point --config (OUTBOX_CONFIG) at the TOML settings file)",
    ),
    (
        "--config pointing at a folder",
        ["--config", "{tmp}", "status"],
        None,
        1,
        "error: settings file {tmp} is a folder, not a file (fix: name the TOML file itself, "
        "e.g. --config {tmp}/outbox.toml)",
    ),
    (
        "requeue of an id past any id",
        ["dead-letters", "requeue", "99999999999999999999"],
        None,
        1,
        "error: no dead letter has id 99999999999999999999 (fix: list them with `outbox "
        "dead-letters list`)",
    ),
    (
        "show of an id past any id",
        ["dead-letters", "show", "99999999999999999999"],
        None,
        1,
        "error: no dead letter has id 99999999999999999999 (fix: list them with `outbox "
        "dead-letters list`)",
    ),
    (
        "peek with a limit past any limit",
        ["queue", "peek", "shipments", "--limit", "99999999999999999999"],
        None,
        2,
        "error: Invalid value for '--limit' / '-n': 99999999999999999999 is not in the range "
        "1<=x<=1000000. (see `main queue peek --help`)",
    ),
    (
        "devices with a limit past any limit",
        ["devices", "list", "--limit", "99999999999999999999"],
        None,
        2,
        "error: Invalid value for '--limit': 99999999999999999999 is not in the range "
        "1<=x<=1000000. (see `main devices list --help`)",
    ),
    # --- item 6: a typo is not an empty success -----------------------------------------------
    (
        "peek of a queue nothing names",
        ["queue", "peek", "no-such-queue"],
        None,
        1,
        "error: queue 'no-such-queue' is unknown: it holds no messages or dead letters, and no "
        "setting names it (fix: peek one of outbox-commands, shipments (`outbox queue stats` "
        "lists them))",
    ),
    (
        "peek of a misspelt queue",
        ["queue", "peek", "shipmnets", "--deferred"],
        None,
        1,
        "error: queue 'shipmnets' is unknown (did you mean 'shipments'?): it holds no messages "
        "or dead letters, and no setting names it (fix: peek one of outbox-commands, shipments "
        "(`outbox queue stats` lists them))",
    ),
    (
        "show of a device nothing is known of",
        ["devices", "show", "unknown-device"],
        None,
        1,
        "error: device 'unknown-device' is unknown on queue 'devices': it has no task, no failed "
        "task and no recorded presence there (fix: list the devices with `outbox devices list "
        "--destination devices`)",
    ),
    # --- item 9: one line for every option mistake, before or after the command name ----------
    (
        "a bad value of a top-level option",
        ["--log-format", "xml", "status"],
        None,
        2,
        "error: Invalid value for '--log-format': 'xml' is not one of 'text', 'json'. (see "
        "`main --help`)",
    ),
    (
        "an unknown top-level option",
        ["--frobnicate", "status"],
        None,
        2,
        "error: No such option '--frobnicate'. (see `main --help`)",
    ),
    (
        "-w '' before the command",
        ["-w", "", "status"],
        None,
        2,
        f"error: Invalid value for '--workspace' / '-w': {_EMPTY_PATH} (see `main --help`)",
    ),
    (
        "-w '' after the command",
        ["status", "-w", ""],
        None,
        2,
        f"error: Invalid value for '--workspace' / '-w': {_EMPTY_PATH} (see `main status --help`)",
    ),
    (
        "--config ''",
        ["--config", "", "status"],
        None,
        2,
        f"error: Invalid value for '--config': {_EMPTY_PATH} (see `main --help`)",
    ),
    (
        "--once with --until-idle",
        ["run-dispatcher", "--once", "--until-idle"],
        None,
        2,
        "error: --once and --until-idle exclude each other: --once stops when nothing is "
        "deliverable now, --until-idle waits for scheduled and backed-off commands too (see "
        "`main run-dispatcher --help`)",
    ),
    (
        "--max-backoff 0s",
        ["run-dispatcher", "--once", "--max-backoff", "0s"],
        None,
        1,
        "error: --max-backoff: '0s' is not a positive duration (fix: write it like 30s, 5m or 1h)",
    ),
    (
        "a duration without a unit",
        ["run-dispatcher", "--once", "--poll-interval", "5"],
        None,
        1,
        "error: --poll-interval: '5' has no unit (fix: say which: 5ms, 5s, 5m or 5h)",
    ),
    (
        "an infinite duration",
        ["run-dispatcher", "--once", "--max-backoff", "inf"],
        None,
        1,
        "error: --max-backoff: 'inf' is not a duration (fix: write it like 15s, 90s, 5m, 1h or "
        "1h30m)",
    ),
    (
        "a gateway lifetime without a unit",
        [*_GATEWAY, "--time-to-live", "10"],
        None,
        1,
        "error: --time-to-live: '10' has no unit (fix: say which: 10ms, 10s, 10m or 10h)",
    ),
    (
        "a gateway retry interval of 0s",
        [*_GATEWAY, "--retry-interval", "0s"],
        None,
        1,
        "error: --retry-interval: '0s' is not a positive duration (fix: write it like 30s, 5m or "
        "1h)",
    ),
    # --- item 3: migrate on a damaged log (in-process: no backtrace either) --------------------
    (
        "migrate on a damaged Delta log",
        ["migrate"],
        _damaged_log,
        1,
        "error: the Delta log of the table at {ws}/documents is damaged: "
        "00000000000000000000.json is not valid JSON (Kernel error: Json error: Encountered "
        "unexpected 'n' whilst parsing object) (fix: restore "
        "{ws}/documents/_delta_log/00000000000000000000.json from a backup or a replica; Delta "
        "cannot rebuild its log from the data files)",
    ),
]


def _fmt(value: str, ws: Path, tmp: Path) -> str:
    return value.replace("{ws}", str(ws.absolute())).replace("{tmp}", str(tmp))


@pytest.mark.parametrize(
    ("argv", "setup", "code", "expected"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_one_line_with_the_documented_code(
    ws: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    argv: list[str],
    setup: Callable[[Path, Path], None] | None,
    code: int,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # `-w ''` once ran on ./.outbox: never the repository's
    if setup is not None:
        setup(ws, tmp_path)
    args = [_fmt(a, ws, tmp_path) for a in argv]
    if "-w" not in args:
        args = ["-w", str(ws), *args]
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, SystemExit | None), result.exception
    assert (result.exit_code, result.stdout) == (code, ""), result.output
    lines = [ln for ln in result.stderr.splitlines() if not ln[:4].isdigit()]  # drop log lines
    assert lines == [_fmt(expected, ws, tmp_path)]
    assert not (tmp_path / ".outbox").exists()


def test_peek_tells_a_misspelt_queue_from_an_empty_one(ws: Path) -> None:
    """A queue no message, dead letter or setting names is a typo (exit 1); the command queue,
    which the settings name, is a table without rows when empty (exit 0), and a queue holding
    messages shows them."""
    runner = CliRunner()
    typo = runner.invoke(main, ["-w", str(ws), "queue", "peek", "outbox-comands"])
    assert (typo.exit_code, typo.stdout) == (1, "")
    assert "'outbox-comands' is unknown (did you mean 'outbox-commands'?)" in typo.stderr
    empty = runner.invoke(main, ["-w", str(ws), "queue", "peek", "outbox-commands"])
    assert (empty.exit_code, empty.stderr) == (0, "")
    assert empty.stdout.splitlines()[0] == "# outbox-commands: first 20"
    held = runner.invoke(main, ["-w", str(ws), "queue", "peek", "shipments", "--json"])
    assert [m["message_id"] for m in json.loads(held.stdout)] == ["shipments-0"]


def test_duration_options_are_one_type_and_show_duration_in_help() -> None:
    """One DURATION type for the dispatcher's and the gateway's duration options, so each shows
    DURATION in ``--help`` (run-dispatcher's ``--poll-interval`` showed TEXT) and refuses the
    same values (the cases above)."""
    from outbox.app.cli.support import Duration

    durations = {
        ("run-dispatcher",): ["--poll-interval", "--max-backoff"],
        ("run-gateway", "mqtt"): ["--retry-interval", "--time-to-live", "--poll-interval"],
    }
    for path, options in durations.items():
        result = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        for option in options:
            [line] = [ln for ln in result.stdout.splitlines() if ln.strip().startswith(option)]
            assert line.split()[:2] == [option, "DURATION"], line
    dispatcher: Any = main.commands["run-dispatcher"]
    gateway: Any = main.commands["run-gateway"]
    typed = {
        p.name
        for c in (dispatcher, gateway.commands["mqtt"])
        for p in c.params
        if isinstance(p.type, Duration)
    }
    assert typed == {"poll_interval", "max_backoff", "retry_interval", "time_to_live"}


def _keys(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield key
            yield from _keys(value)
    elif isinstance(data, list):
        for item in data:
            yield from _keys(item)


def _json(ws: Path, *argv: str) -> Any:
    result = CliRunner().invoke(main, ["-w", str(ws), *argv, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_names_every_duration_in_seconds_with_s(ws: Path) -> None:
    """``delay_s``, ``duration_s``, ``lag_seconds`` and a bare ``seconds`` named one kind of
    value four ways: now every duration is a number of seconds under a key ending in ``_s``
    (``vacuum_retention_hours`` 2 is ``vacuum_retention_s`` 7200). A message's headers keep the
    names the user gave them."""
    _send(ws, "nobody-reads", ago=3600)  # a queue nobody receives from: its oldest age
    rescued = _json(ws, "rescue")
    status = _json(ws, "status")
    maintained = _json(ws, "maintain", "--vacuum", "2h")
    _send(ws, "orders", headers={"timeout_seconds": "5"})
    from dispatcher.queue import SqlQueue

    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as q:
        [msg] = q.receive("orders", 1)
        q.dead_letter(msg, "Poison", "cannot be handled")
        [dead] = q.list_dead_letters("orders", 1)
    shown = _json(ws, "dead-letters", "show", str(dead.id))

    for document in (rescued, status, maintained):
        keys = set(_keys(document))
        assert not {k for k in keys if k == "seconds" or k.endswith(("_seconds", "_hours"))}
    assert {"delay_s", "duration_s", "lag_s"} <= set(rescued)
    assert "oldest_pending_age_s" in status
    assert {"lag_s", "last_pass_age_s"} <= set(status["checkpoints"][0])
    assert {"oldest_age_s"} <= set(status["unread_queues"][0])
    assert maintained["vacuum_retention_s"] == 7200
    assert isinstance(maintained["duration_s"], float)
    assert shown["headers"] == {"timeout_seconds": "5"}


def test_migrate_says_what_each_revision_does_without_issue_numbers(tmp_path: Path) -> None:
    """Each applied SQL revision is its whole first sentence, with no "(issue 14)": a number
    that means nothing to the operator reading it. A database at 0004 gets the later ones; a
    new one is created at the head in one step, and says so."""
    from alembic import command

    from migrations.sql import _config, head_revision
    from outbox.core.sql import make_engine

    (tmp_path / "ws").mkdir()
    engine = make_engine(f"sqlite:///{tmp_path / 'ws' / 'outbox.db'}")
    cfg = _config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004_inbox_claims")
        conn.commit()
    engine.dispose()
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "migrate"])
    assert result.exit_code == 0, result.output
    applied = [ln for ln in result.stdout.splitlines() if "sql schema: applied" in ln]
    assert len(applied) >= 6
    assert not [ln for ln in applied if "(issue" in ln]
    assert applied[0] == (
        "- sql schema: applied 0005_session_states (Session states: a paused session is left out "
        "of every receive, and a lock says when it was taken (device fleets).)"
    )
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "new"), "migrate"])
    assert result.exit_code == 0, result.output
    assert [ln for ln in result.stdout.splitlines() if "sql schema" in ln] == [
        f"- sql schema: created at {head_revision()} (a new database: the newest schema at "
        "once, not revision by revision)"
    ]


# --- real processes: what a pipe and a shell see ----------------------------------------------


def _cli(*argv: str, pipe_to: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m outbox.app.cli ARGV`` (``| PIPE_TO`` in a shell): the return code is the
    outbox command's own, stdout what the reader printed."""
    command = [sys.executable, "-m", "outbox.app.cli", *argv]
    if pipe_to is not None:
        script = f'"$@" | {pipe_to}; exit "${{PIPESTATUS[0]}}"'
        command = ["bash", "-c", script, "_", *command]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
        check=False,
    )


def test_a_reader_that_stops_reading_ends_the_command_quietly(ws: Path) -> None:
    """``outbox status | head -1`` printed "unexpected BrokenPipeError ... report it" in 3 of 5
    runs. The reader leaving is not a failure: exit 141 (128 + SIGPIPE, as for ``yes | head``),
    nothing on stderr, no "Exception ignored" at exit."""
    _send(ws, "bulk", BULK)
    peek = _cli("-w", str(ws), "queue", "peek", "bulk", "-n", str(BULK), pipe_to="head -1")
    assert (peek.returncode, peek.stdout, peek.stderr) == (141, f"# bulk: first {BULK}\n", "")
    # `true` reads nothing and is gone before status writes its first line
    status = _cli("-w", str(ws), "status", pipe_to="true")
    assert (status.returncode, status.stderr) == (141, "")


def test_migrate_on_a_damaged_log_prints_no_rust_backtrace(ws: Path) -> None:
    """With RUST_BACKTRACE set (a Rust developer's shell), deltalake's error text carries a
    backtrace of a dozen lines; migrate prints the damaged file and the fix, one line."""
    _damaged_log(ws, ws)
    done = _cli("-w", str(ws), "migrate", RUST_BACKTRACE="1")
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"error: the Delta log of the table at {ws.absolute()}/documents is damaged: "
        "00000000000000000000.json is not valid JSON (Kernel error: Json error: Encountered "
        "unexpected 'n' whilst parsing object) (fix: restore "
        f"{ws.absolute()}/documents/_delta_log/00000000000000000000.json from a backup or a "
        "replica; Delta cannot rebuild its log from the data files)"
    ]


def test_s3_without_credentials_prints_no_aws_warnings_even_with_v(ws: Path) -> None:
    """The AWS SDK warns once per credential source it tries before "no credentials"; our one
    line says what to set. ``-v`` keeps Rust's other warnings, not those."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "RUST_LOG")) and k != "OUTBOX_TABLE_URI"
    }
    done = subprocess.run(
        [sys.executable, "-m", "outbox.app.cli", "-v", "-w", str(ws), "status"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "OUTBOX_TABLE_URI": "s3://no-such-bucket/t"},
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    lines = [ln for ln in done.stderr.splitlines() if not ln[:4].isdigit()]  # drop our logs
    assert lines == [
        "error: cannot reach the Delta table at s3://no-such-bucket/t: no credentials for S3 "
        "(fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (in [storage_options] or the "
        "environment), a profile (AWS_PROFILE), or the machine's role)"
    ]

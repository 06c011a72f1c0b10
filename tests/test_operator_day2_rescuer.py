"""The operator's day, round 2 (issue 35): rescuer names that cannot be mistyped into harm, a
stale rescuer that holds back the log named, demos that run after the README's first command and
stop cleanly on Ctrl-C, ``rescue --every`` that says it is alive, and README text that is true."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox import Outbox
from outbox.app.cli import main
from outbox.core.clock import ManualClock

OUTBOX = str(Path(sys.executable).with_name("outbox"))
REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A migrated workspace holding one dispatched document, and the default rescuer's
    checkpoint (one pass has run)."""
    path = tmp_path / "ws"
    with (
        Outbox.open(path, transport="memory", default_destination="shipments") as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("pkg-1", type="Package").send("Left", {"at": "Seattle"})
    assert CliRunner().invoke(main, ["-w", str(path), "rescue"]).exit_code == 0
    return path


def _rescuers(ws: Path) -> list[str]:
    with sqlite3.connect(ws / "outbox.db") as con:
        rows = con.execute("SELECT rescuer_name FROM outbox_checkpoints ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]


def _run(ws: Path, *argv: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["-w", str(ws), *argv], env=env)


# --- item 5: rescuer names ---------------------------------------------------------------------


def test_a_mistyped_rescuer_name_starts_nothing_and_a_new_name_needs_new(ws: Path) -> None:
    """A typo in ``--name`` used to start a rescuer silently, whose checkpoint then held back
    the log trim and vacuum for good."""
    table = ws.absolute() / "documents"
    typo = _run(ws, "rescue", "--name", "nightyl")
    assert (typo.exit_code, typo.stdout) == (1, "")
    assert typo.stderr.splitlines() == [
        f"error: rescuer 'nightyl' has no checkpoint for {table} (its rescuers: 'default'); "
        "nothing was run (fix: check the name, or add --new to start a rescuer under it (its "
        "checkpoint then holds back the log trim and vacuum until `outbox rescue --name "
        "nightyl --forget`))"
    ]
    assert _rescuers(ws) == ["default"]
    started = _run(ws, "rescue", "--name", "nightly", "--new")
    assert started.exit_code == 0, started.output
    assert _rescuers(ws) == ["default", "nightly"]
    assert _run(ws, "rescue", "--name", "nightly").exit_code == 0  # it exists now
    close = _run(ws, "rescue", "--name", "nightli")
    assert close.exit_code == 1
    assert "(its rescuers: 'default', 'nightly') (did you mean 'nightly'?)" in close.stderr
    again = _run(ws, "rescue", "--name", "nightly", "--new")
    assert again.exit_code == 1
    assert again.stderr.splitlines() == [
        f"error: --new: rescuer 'nightly' already has a checkpoint for {table}; nothing was run "
        "(fix: drop --new to continue it, or pick a name no rescuer of the table has)"
    ]
    # the rescuer_name setting is a name like --name: a new one needs --new too
    setting = _run(ws, "rescue", env={"OUTBOX_RESCUER_NAME": "weekly"})
    assert setting.exit_code == 1
    assert "rescuer 'weekly' has no checkpoint" in setting.stderr
    assert _rescuers(ws) == ["default", "nightly"]


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["rescue", "--name", ""],
            {},
            "error: --name: a rescuer name cannot be empty (fix: leave --name out for the "
            "rescuer_name setting ('default' unless set), or give a name)",
        ),
        (
            ["rescue", "--name", "", "--forget", "--yes"],
            {},
            "error: --name: a rescuer name cannot be empty (fix: leave --name out for the "
            "rescuer_name setting ('default' unless set), or give a name)",
        ),
        (
            ["rescue", "--name", " default"],
            {},
            "error: --name ' default' has spaces around it (fix: write it as 'default')",
        ),
        (
            ["rescue"],
            {"OUTBOX_RESCUER_NAME": ""},
            "error: setting 'rescuer_name': a rescuer name cannot be empty (fix: give it a name, "
            "or unset it for 'default')",
        ),
    ],
    ids=["--name ''", "--forget --name ''", "spaces", "empty setting"],
)
def test_an_empty_rescuer_name_is_refused_not_taken_for_default(
    ws: Path, argv: list[str], env: dict[str, str], expected: str
) -> None:
    result = _run(ws, *argv, env=env)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [expected]
    assert _rescuers(ws) == ["default"]  # nothing forgotten, nothing started


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--name", "x", "--new", "--forget"],
            "error: --new and --forget exclude each other: --new starts a rescuer, --forget "
            "deletes one (see `main rescue --help`)",
        ),
        (
            ["--yes"],
            "error: --yes confirms --forget only (a rescue pass deletes nothing) (see `main "
            "rescue --help`)",
        ),
    ],
    ids=["--new --forget", "--yes alone"],
)
def test_rescue_options_that_exclude_each_other_are_one_usage_line(
    ws: Path, argv: list[str], expected: str
) -> None:
    result = _run(ws, "rescue", *argv)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [expected]
    assert _rescuers(ws) == ["default"]


def test_forget_needs_a_name_and_a_confirmation(ws: Path) -> None:
    """``--forget`` alone deleted the default rescuer's checkpoint without asking."""
    bare = _run(ws, "rescue", "--forget")
    assert (bare.exit_code, bare.stdout) == (1, "")
    assert bare.stderr.splitlines() == [
        "error: --forget needs --name: say which rescuer's checkpoint to delete; nothing was "
        "deleted (fix: outbox rescue --name NAME --forget (`outbox status` lists the rescuers))"
    ]
    scripted = _run(ws, "rescue", "--name", "default", "--forget")  # stdin is not a terminal
    assert scripted.exit_code == 1
    assert scripted.stderr.splitlines() == [
        "error: --forget would delete the checkpoint of rescuer 'default' and stdin is not a "
        "terminal to confirm it; nothing was deleted (fix: add --yes to confirm)"
    ]
    assert _rescuers(ws) == ["default"]
    assert _forget_on_a_terminal(ws, "n").returncode == 1
    assert _rescuers(ws) == ["default"]
    yes = _forget_on_a_terminal(ws, "y")
    assert (yes.returncode, yes.stdout) == (0, f"forgot rescuer 'default' of {ws / 'documents'}\n")
    assert _rescuers(ws) == []
    missing = _run(ws, "rescue", "--name", "defualt", "--forget", "--yes")
    assert missing.exit_code == 0
    assert missing.stdout.splitlines() == [
        f"rescuer 'defualt' has no checkpoint for {ws.absolute() / 'documents'}; nothing was "
        "deleted (its rescuers: none)"
    ]


def _forget_on_a_terminal(ws: Path, answer: str) -> subprocess.CompletedProcess[str]:
    """``rescue --name default --forget`` with a real terminal (a pty) on stdin."""
    import pty

    leader, follower = pty.openpty()
    try:
        os.write(leader, answer.encode() + b"\n")
        return subprocess.run(
            [OUTBOX, "-w", str(ws), "rescue", "--name", "default", "--forget"],
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(leader)
        os.close(follower)


def test_stale_rescuers_are_the_ones_that_hold_back_the_log() -> None:
    """For ``outbox status``: a rescuer that has not run for an hour and keeps versions of the
    log that no running rescuer needs; one at or past the running ones holds nothing back."""
    from rescuer.checkpoint import InMemoryCheckpointStore, StaleRescuer, stale_rescuers

    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    store = InMemoryCheckpointStore()
    for name, version, ago in (
        ("default", 40, timedelta(seconds=20)),  # runs
        ("typo", 5, timedelta(days=3)),  # started by a typo, never again
        ("retired", 12, timedelta(hours=2)),
        ("slow-but-ahead", 45, timedelta(hours=5)),  # past the running one: holds nothing
        ("never-covered", None, timedelta(days=1)),
    ):
        store.write("/t", name, expected_generation=None, version=version, at=now - ago, details={})
    stale = stale_rescuers(store.list("/t"), latest_version=50, now=now)
    assert stale == [
        StaleRescuer("typo", 5, now - timedelta(days=3), 259200.0, 35),
        StaleRescuer("retired", 12, now - timedelta(hours=2), 7200.0, 28),
    ]
    assert stale[0].describe() == (
        "rescuer 'typo' has not run for 72h00m and holds back 35 version(s) of the log (its "
        "checkpoint is at version 5)"
    )
    # with no rescuer running, the table's latest version is the floor
    alone = stale_rescuers(store.list("/t"), latest_version=50, now=now + timedelta(hours=1))
    assert [(s.rescuer_name, s.versions_held) for s in alone] == [
        ("typo", 45),
        ("retired", 38),
        ("default", 10),
        ("slow-but-ahead", 5),
    ]
    assert stale_rescuers(store.list("/t"), latest_version=50, now=now, stale_after=7 * 86400) == []


# --- item 7: every demo runs after the README's first command ------------------------------------


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        (
            "paho",
            "error: the devices demo needs the mqtt extra (paho-mqtt), not installed here; "
            "nothing was queued (fix: run ./scripts/demo.sh, which installs what every demo "
            "needs (or pip install 'delta-outbox[mqtt]'))",
        ),
        (
            "mosquitto",
            "error: the devices demo needs mosquitto (a local MQTT broker), not installed here; "
            "nothing was queued (fix: run ./scripts/demo.sh, which installs what every demo "
            "needs (or scripts/ensure-mosquitto.sh))",
        ),
        (
            "both",
            "error: the devices demo needs the mqtt extra (paho-mqtt) and mosquitto (a local "
            "MQTT broker), not installed here; nothing was queued (fix: run ./scripts/demo.sh, "
            "which installs what every demo needs (or pip install 'delta-outbox[mqtt]' and "
            "scripts/ensure-mosquitto.sh))",
        ),
    ],
)
def test_demo_devices_checks_what_it_needs_before_it_queues_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, expected: str
) -> None:
    """It used to queue its tasks and only then find paho-mqtt missing (the README's first
    command did not install it), leaving the tasks in a kept workspace."""
    import outbox.testing.mosquitto

    if missing in ("paho", "both"):
        monkeypatch.setitem(sys.modules, "paho.mqtt.client", None)  # not installed
    if missing in ("mosquitto", "both"):
        monkeypatch.setattr(outbox.testing.mosquitto, "mosquitto_binary", lambda: None)
    target = tmp_path / "devices-demo"
    result = CliRunner().invoke(main, ["demo", "devices", "-w", str(target)])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [expected]
    assert not target.exists() or list(target.iterdir()) == []  # nothing queued


def test_the_readmes_first_command_installs_what_every_demo_it_names_needs() -> None:
    """``./scripts/demo.sh`` is the README's main job; ``outbox demo devices`` needs paho-mqtt
    (the mqtt extra) and mosquitto, so the script installs both before the demo runs."""
    from outbox.app.cli.demo import demo

    stories = {"", *next(p for p in demo.params if p.name == "story").type.choices}  # type: ignore[attr-defined]
    named = set(re.findall(r"outbox demo ?(geo|devices)?\b", README.read_text()))
    assert named == stories  # every story the README names exists, and it names every one
    script = (REPO / "scripts" / "demo.sh").read_text().splitlines()
    run = next(i for i, line in enumerate(script) if line.startswith("exec "))
    before = "\n".join(script[:run])
    assert re.search(r"uv pip install .*-e '\.\[mqtt\]'", before)
    assert re.search(r"^scripts/ensure-mosquitto\.sh", before, flags=re.M)


# --- item 8: Ctrl-C of the demo ---------------------------------------------------------------


def _worker_child(pid: int) -> int | None:
    """A child process of ``pid`` doing the story's work (multiprocessing's resource tracker, if
    any, is not one)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if parent == pid and b"resource_tracker" not in cmdline:
            return int(stat.parent.name)
    return None


def _age(pid: int) -> float:
    """Seconds since ``pid`` started (from /proc)."""
    started = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - started / os.sysconf("SC_CLK_TCK")


def _until(condition: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll a condition of another process (only /proc can tell), within ``timeout``."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick.wait(0.02)
    return value


@pytest.fixture
def demo_tmp(tmp_path: Path) -> Path:
    """The demo's TMPDIR: where its temporary workspace (and any other) goes."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


def _start_demo(demo_tmp: Path, *argv: str) -> subprocess.Popen[str]:
    """``outbox demo ...`` in a process group of its own, as a terminal runs a command."""
    return subprocess.Popen(
        [OUTBOX, "demo", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(demo_tmp)},
        start_new_session=True,
    )


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C at the terminal: SIGINT to the whole foreground process group."""
    os.killpg(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=120)


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_ctrl_c_of_the_demo_stops_its_child_quietly_and_removes_its_folder(
    demo_tmp: Path,
) -> None:
    """Ctrl-C while the hub scanner (a child process) runs: the child used to get the SIGINT too
    and print a traceback of its own."""
    proc = _start_demo(demo_tmp, "--packages", "3")
    try:
        assert proc.stdout is not None
        _until(lambda: "hub scanner" in proc.stdout.readline(), "the hub scanner's step")
        child = _until(lambda: _worker_child(proc.pid), "the hub scanner's process")
        _until(lambda: _age(child) >= 0.3, "the hub scanner to be under way")
        _out, err = _ctrl_c(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    _stopped_by_ctrl_c(proc, err)
    assert not Path(f"/proc/{child}").exists()  # stopped, and reaped
    assert list(demo_tmp.iterdir()) == []


def _stopped_by_ctrl_c(proc: subprocess.Popen[str], err: str) -> None:
    """Exit 130 and one line saying the demo stopped and its folder went: no traceback."""
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "interrupted: the demo stopped before finishing; its temporary workspace was removed"
    )


def test_ctrl_c_of_the_geo_demo_stops_its_consumers_and_removes_its_folder(
    demo_tmp: Path,
) -> None:
    proc = _start_demo(demo_tmp, "geo", "--packages", "3")
    try:
        assert proc.stdout is not None
        _until(lambda: "two regions" in proc.stdout.readline(), "the regions' step")
        _out, err = _ctrl_c(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    _stopped_by_ctrl_c(proc, err)
    assert list(demo_tmp.iterdir()) == []


# --- item 10: rescue --every ------------------------------------------------------------------


@dataclasses.dataclass
class _Loop:
    """How many passes a ``rescue --every`` under test runs."""

    passes: int = 25


@pytest.fixture
def looping(monkeypatch: pytest.MonkeyPatch) -> _Loop:
    """``rescue --every`` on a clock an hour ahead (every commit is past the delay), stopped
    after ``passes`` passes instead of by a signal."""
    from rescuer.scheduler import Scheduler

    loop = _Loop()
    clock = ManualClock(datetime.now(UTC) + timedelta(hours=1))
    real_run = Scheduler.run

    def run(self: Scheduler, **kwargs: Any) -> int:
        return real_run(self, **kwargs, max_passes=loop.passes)

    monkeypatch.setattr("outbox.app.cli.rescue.SystemClock", lambda: clock)
    monkeypatch.setattr(Scheduler, "run", run)
    return loop


def test_rescue_every_says_it_is_alive_while_idle_at_a_bounded_cadence(
    ws: Path, looping: _Loop, caplog: pytest.LogCaptureFixture
) -> None:
    """25 passes 30 s apart: the first (a sweep) is printed; the 24 idle ones used to print
    nothing at all in text, which looks like a hang. Now a line at most every 5 minutes."""
    caplog.set_level(logging.INFO, logger="outbox.rescue")
    result = _run(ws, "rescue", "--every", "30s")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1  # the first pass; idle ones stay off stdout
    idle = [r.getMessage() for r in caplog.records if r.name == "outbox.rescue"]
    assert (
        idle
        == [
            f"idle: 10 pass(es) in the last 5m00s found nothing to rescue; checkpoint at version "
            f"{_table_version(ws)}, lag 0v/0ms"
        ]
        * 2
    )


def _table_version(ws: Path) -> int:
    from outbox.delta.store import DeltaDocumentStore

    store = DeltaDocumentStore(str(ws / "documents"))
    try:
        return store.version()
    finally:
        store.close()


def test_rescue_every_alone_runs_every_rescue_interval(ws: Path, looping: _Loop) -> None:
    """``rescue_interval`` had no effect; ``--every`` without a value now takes it, and an idle
    pass is ``"mode": "idle"`` in JSON as in text."""
    looping.passes = 3
    result = _run(ws, "rescue", "--every", "--json", env={"OUTBOX_RESCUE_INTERVAL": "10s"})
    assert result.exit_code == 0, result.output
    passes = [json.loads(line) for line in result.stdout.splitlines()]
    started = [datetime.fromisoformat(p["started_at"]) for p in passes]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(started)] == [10, 10]
    assert [p["mode"] for p in passes] == ["sweep", "idle", "idle"]


# --- item 12: the README and output text -------------------------------------------------------


def test_the_readme_python_blocks_run_twice_in_one_folder_and_print_no_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reader runs the snippets again in the same folder: ``assert msg.seq == 2`` failed
    then, and creating ``shipment-43`` again too; the receive loop printed ``b'{...}'``."""
    from tests.test_readme import python_blocks

    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    for run in (1, 2):
        namespace: dict[str, object] = {"__name__": "readme"}
        for i, block in enumerate(python_blocks()):
            try:
                exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
            except Exception as e:  # pragma: no cover - the failure message is the point
                pytest.fail(f"run {run}, README python block {i + 1}: {type(e).__name__}: {e}")
    printed = capsys.readouterr().out
    assert "left-seattle" in printed
    assert "b'{" not in printed


def _table(title: str, page: Path) -> list[str]:
    """The rows of ``page``'s table whose header row starts with ``title`` (README's tables
    before issue 43 moved them into docs/)."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_settings_table_names_every_setting() -> None:
    """``command_transport``, ``checkpoint_store`` and the ``cosmos_*`` settings were missing;
    a setting is named in a row of its own or in the row of its group (``kafka_*``)."""
    from outbox.core.settings import Settings

    table = "\n".join(_table("setting", REPO / "docs" / "configuration.md"))
    named = set(re.findall(r"`([a-z_]+)`", table))
    assert [f.name for f in dataclasses.fields(Settings) if f.name not in named] == []


def test_the_operations_table_has_a_row_for_every_command_and_demo() -> None:
    """``outbox demo geo`` and ``outbox check`` had no row."""
    from outbox.app.cli.demo import demo

    table = _table("command", REPO / "docs" / "operations.md")
    rows = [re.match(r"\| `outbox ([a-z-]+(?: [a-z-]+)?)", r) for r in table]
    firsts = {m.group(1) for m in rows if m}
    stories = next(p for p in demo.params if p.name == "story").type.choices  # type: ignore[attr-defined]
    missing = [c for c in main.commands if not any(f.split()[0] == c for f in firsts)]
    assert missing == []
    assert [s for s in stories if f"demo {s}" not in firsts] == []


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_geo_demo_says_east_was_failed_on_purpose(caplog: pytest.LogCaptureFixture) -> None:
    """Its warning told the person watching to "call outage(False)" (the test kit's hint)."""
    caplog.set_level(logging.WARNING, logger="outbox.transports.geo")
    result = CliRunner().invoke(main, ["demo", "geo", "--packages", "3"])
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if r.name == "outbox.transports.geo"]
    assert warnings, "east missed no send"
    assert all("outage(False)" not in w and "FaultyTransport" not in w for w in warnings)
    assert "region east is down (the demo failed it on purpose)" in warnings[0]


def test_completing_a_message_twice_says_it_was_settled_not_that_its_lock_expired(
    tmp_path: Path,
) -> None:
    from dispatcher.queue import QueueMessage, SqlQueue
    from migrations.sql import upgrade
    from outbox.core.errors import LockLostError

    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    clock = ManualClock()
    with SqlQueue(url, clock=clock) as queue:
        queue.send("q", [QueueMessage(b"{}", "m-1"), QueueMessage(b"{}", "m-2")])
        first, second = queue.receive("q", 2)
        queue.complete(first)
        with pytest.raises(LockLostError) as twice:
            queue.complete(first)
        assert str(twice.value) == (
            "message m-1: it is no longer in the queue: it was settled already (completed or "
            "dead-lettered, by this receiver or by another after this lock ran out); nothing "
            "changed (fix: settle each received message once)"
        )
        clock.advance(31)  # past the 30 s lock
        with pytest.raises(LockLostError, match=r"^message m-2: its lock expired; nothing changed"):
            queue.complete(second)


def test_status_names_a_rescuer_that_stopped_and_holds_back_the_log(ws: Path) -> None:
    """A rescuer whose last pass was two days ago, at version 0, while the table moved on: status
    warns (one line, with the fix) and says it in JSON; the fresh default rescuer is not named."""
    from datetime import UTC, datetime, timedelta

    from rescuer.checkpoint import SqlCheckpointStore

    with Outbox.open(ws, transport="memory", default_destination="shipments") as ob:
        for i in range(3):
            with ob.unit_of_work() as uow:
                uow.create(f"pkg-{i + 2}", type="Package").send("Left", {"at": "Seattle"})
    table = str((ws / "documents").absolute())
    store = SqlCheckpointStore(f"sqlite:///{ws / 'outbox.db'}")
    try:
        store.write(
            table,
            "retired",
            expected_generation=None,
            version=0,
            at=datetime.now(UTC) - timedelta(days=2),
            details={},
        )
    finally:
        store.close()
    result = _run(ws, "status")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith("warning: rescuer 'retired' has not run for ")
    assert "`outbox rescue --name retired --forget --yes`" in warnings[0]
    shown = json.loads(_run(ws, "status", "--json").stdout)
    assert [s["rescuer_name"] for s in shown["stale_rescuers"]] == ["retired"]
    assert shown["stale_rescuers"][0]["versions_held"] > 0

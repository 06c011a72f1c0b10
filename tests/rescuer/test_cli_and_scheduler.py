"""``outbox rescue`` end to end on a workspace, the scheduler loop, and the missing-JAR message."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.core.errors import EngineError
from outbox.core.model import DocumentRow
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from rescuer.cdf_spark import find_jars
from rescuer.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("delay", ["5s", "2h", "soon"])
def test_bad_delay_is_one_clear_line(workspace: Path, delay: str) -> None:
    result = CliRunner().invoke(main, ["-w", str(workspace), "rescue", "--delay", delay])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "delay" in lines[0]


def test_rescue_json_enqueues_commands_into_the_sql_queue(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["-w", str(workspace), "migrate"]).exit_code == 0
    store = DeltaDocumentStore(str((workspace / "documents").absolute()))
    v = store.save([DocumentWrite(DocumentRow("d1", "t", 1, {}, 2, 0, []), 0, store.version())])
    ts = int(store.delta_table.history(1)[0]["timestamp"])
    from datetime import UTC, datetime

    later = datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(seconds=31)
    monkeypatch.setattr("outbox.app.cli.rescue.SystemClock", lambda: ManualClock(later))
    result = runner.invoke(main, ["-w", str(workspace), "rescue", "--json", "--delay", "30s"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["mode"] == "sweep"
    assert report["commands_enqueued"] == 1
    assert report["checkpoint_after"] == v
    idle = runner.invoke(main, ["-w", str(workspace), "rescue", "--json", "--delay", "30s"])
    assert json.loads(idle.output[idle.output.index("{") :])["mode"] == "idle"  # nothing new
    args = ["-w", str(workspace), "rescue", "--json", "--delay", "30s", "--full"]
    again = runner.invoke(main, args)
    report2 = json.loads(again.output[again.output.index("{") :])
    assert report2["mode"] == "sweep"
    assert report2["pending_documents"] == 1
    assert report2["commands_enqueued"] == 0  # the queue dropped the repeated command id

    from dispatcher.queue.sql_queue import SqlQueue

    queue = SqlQueue(f"sqlite:///{(workspace / 'outbox.db').absolute()}")
    peeked = queue.peek("outbox-commands")
    queue.close()
    assert len(peeked) == 1
    assert json.loads(peeked[0].body)["id"] == "d1"

    # a rescuer that is retired is forgotten: it no longer holds back log trimming and vacuum
    from outbox.app.maintenance import oldest_needed_version

    sql_url = f"sqlite:///{(workspace / 'outbox.db').absolute()}"
    assert oldest_needed_version(sql_url, store.uri) == v + 1
    forget = ["-w", str(workspace), "rescue", "--name", "default", "--forget", "--yes", "--json"]
    gone = runner.invoke(main, forget)
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.output)["forgot"] is True
    assert oldest_needed_version(sql_url, store.uri) is None
    assert json.loads(runner.invoke(main, forget).output)["forgot"] is False


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_missing_jars_say_how_to_provide_them(tmp_path: Path) -> None:
    assert find_jars(env={}, roots=[tmp_path]) == []
    with pytest.raises(EngineError, match=r"fetch-jars\.sh.*OUTBOX_DELTA_JARS.*Databricks"):
        find_jars(env={"OUTBOX_DELTA_JARS": str(tmp_path)})
    migrated = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "migrate"])
    assert migrated.exit_code == 0, migrated.output
    # The CLI, in a fresh process (no SparkSession yet): one line that says what to do.
    env = {**os.environ, "OUTBOX_DELTA_JARS": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.app.cli",
            "-w",
            str(tmp_path / "ws"),
            "rescue",
            "--engine",
            "spark",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "fetch-jars.sh" in proc.stderr
    assert "Databricks" in proc.stderr


class _Pass:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.calls: list[Any] = []

    def run(self, *, full: bool = False) -> Any:
        self.calls.append((self.clock.now(), full))
        return object()


def test_scheduler_runs_on_the_clock_until_sigterm() -> None:
    clock = ManualClock()
    rescue = _Pass(clock)
    seen: list[Any] = []

    def on_report(_r: Any) -> None:
        seen.append(_r)
        if len(seen) == 3:
            signal.raise_signal(signal.SIGTERM)

    scheduler = Scheduler(rescue, every=30.0, clock=clock, on_report=on_report)  # type: ignore[arg-type]
    passes = scheduler.run(full_first=True)  # the scheduler's own loop handles SIGTERM
    assert passes == 3
    times = [c[0] for c in rescue.calls]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(times)] == [30, 30]
    assert [c[1] for c in rescue.calls] == [True, False, False]


def test_the_scheduler_stops_on_sigint_too_after_the_pass_in_hand() -> None:
    """Ctrl-C is a graceful stop like SIGTERM (the shared run loop); the pass is not cut short."""
    clock = ManualClock()
    rescue = _Pass(clock)
    finished: list[int] = []

    def on_report(_r: Any) -> None:
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the loop's handler takes it
        finished.append(len(rescue.calls))

    scheduler = Scheduler(rescue, every=30.0, clock=clock, on_report=on_report)  # type: ignore[arg-type]
    assert scheduler.run() == 1
    assert finished == [1]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_rescue_every_stops_cleanly_on_the_first_signal(
    workspace: Path, signum: signal.Signals
) -> None:
    assert CliRunner().invoke(main, ["-w", str(workspace), "migrate"]).exit_code == 0
    outbox = str(Path(sys.executable).with_name("outbox"))
    proc = subprocess.Popen(
        [outbox, "-w", str(workspace), "rescue", "--every", "1h"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline()  # the first pass's report: now waiting for the next
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert err.strip().splitlines()[-1] == "stopped after 1 pass(es)"
    assert "Traceback" not in err

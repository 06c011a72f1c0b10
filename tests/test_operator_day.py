"""The operator's day (issue 17): a quiet worker says what it waits for, ``--once`` tells cron
when a command was not completed, ``--max-backoff`` caps the retry wait, and text output shows
no Python reprs."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dispatcher.queue.messages import QueueMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox import Outbox
from outbox.app.cli import main, output
from outbox.core.clock import ManualClock, utc
from outbox.delta.store import DeltaDocumentStore


def _waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting: ")]


def test_idle_worker_says_what_it_waits_for_once_per_interval(
    workspace: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="outbox.worker")
    with Outbox.open(workspace, clock=clock, transport=InMemoryTransport()) as ob:
        worker = DispatcherWorker(ob.runtime, wait_log_interval=30)
        queue = ob.runtime.queue
        assert worker._poll() == 0
        assert _waits(caplog) == ["waiting: the command queue 'outbox-commands' is empty"]
        clock.advance(29)
        assert worker._poll() == 0
        assert len(_waits(caplog)) == 1  # not again within the interval
        # A command held by a worker that died: its lock has not expired yet.
        queue.send("outbox-commands", QueueMessage(body=b"{}", message_id="c-1", session_id="d"))
        assert len(queue.receive("outbox-commands", 1)) == 1
        assert worker._poll() == 0
        assert len(_waits(caplog)) == 1
        clock.advance(1)
        assert worker._poll() == 0
        assert _waits(caplog)[1:] == [
            "waiting: 'outbox-commands': 1 command(s) locked by another worker (or by a stopped "
            "one, until its lock expires)"
        ]


def test_once_exits_1_when_a_command_was_not_completed_and_max_backoff_caps_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    with Outbox.open(ws, dispatch="deferred", default_destination="shipments") as ob:
        with ob.unit_of_work() as uow:
            uow.create("pkg-1", type="Package").send("Left", {"at": "Seattle"})
        table_version = ob.store.version()

    def unreadable(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(DeltaDocumentStore, "read", unreadable)
    started = datetime.now().astimezone()
    # the run's clock stands still (a loaded machine would otherwise move it past the cap)
    monkeypatch.setattr("outbox.app.facade.SystemClock", lambda: ManualClock(started))
    result = CliRunner().invoke(
        main, ["-w", str(ws), "run-dispatcher", "--once", "--max-backoff", "500ms"]
    )
    assert result.exit_code == 1, result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        "error: 1 of 1 command(s) not completed (1 abandoned, 0 dead-lettered, 0 lock lost) "
        "(fix: the warnings above say why; `outbox status` shows what is left)"
    ]
    assert "abandoned          1" in result.stdout.splitlines()
    assert "stopped_by_signal  no" in result.stdout.splitlines()
    monkeypatch.undo()
    with Outbox.open(ws, create=False) as ob:
        (cmd,) = ob.runtime.queue.peek("outbox-commands")
        assert cmd.not_before is not None
        # on the still clock: backoff base 1s, capped at 0.5s (+10% jitter); uncapped 1s or more
        assert (utc(cmd.not_before) - started).total_seconds() < 0.9
        assert ob.store.refresh() == table_version  # nothing written, nothing lost


def test_text_values_are_not_python_reprs() -> None:
    assert [
        output.text_value(v)
        for v in (True, False, None, {"numFilesAdded": 0, "b": None}, [1, "a"], b"x", {}, 3)
    ] == ["yes", "no", "", "numFilesAdded=0, b=", "1, a", "x", "-", "3"]


def test_outbox_open_keeps_alembic_out_of_the_applications_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import subprocess
    import sys

    caplog.set_level(logging.INFO)
    for _ in range(2):  # the first open creates the schema, the second checks its revision
        with Outbox.open(tmp_path / "ws"):
            pass
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alembic")] == []
    # Importing alembic announces its plugins at INFO: not in an application that logs INFO.
    code = "import logging; logging.basicConfig(level=logging.INFO); import migrations.sql"
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert imported.stderr == ""
    # An application that asks for alembic's INFO lines still gets them (a new workspace:
    # alembic stamps its schema's revision; an existing one's check does not use alembic).
    logging.getLogger("alembic").setLevel(logging.INFO)
    try:
        with Outbox.open(tmp_path / "ws2"):
            pass
    finally:
        logging.getLogger("alembic").setLevel(logging.NOTSET)
    assert any(r.name.startswith("alembic") for r in caplog.records)


def _pass(**changes: Any) -> Any:
    from rescuer.runner import PassReport

    fields: dict[str, Any] = {
        "table_uri": "/t",
        "rescuer_name": "default",
        "engine": "local",
        "mode": None,
        "started_at": datetime(2026, 1, 1).astimezone(),
        "duration_s": 0.1,
        "delay_s": 15.0,
        "latest_version": 2,
        "checkpoint_before": None,
        "checkpoint_after": None,
        "window_start": None,
        "window_end": None,
        "versions_scanned": 0,
        "change_rows": 0,
        "documents_examined": 0,
        "pending_documents": 0,
        "commands_enqueued": 0,
        "duplicates_dropped": 0,
        "lag_versions": 0,
        "lag_seconds": 0.0,
    }
    return PassReport(**{**fields, **changes})


def test_rescue_text_has_no_reprs_says_what_was_queued_and_is_quiet_when_idle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from outbox.app.cli import rescue

    rescue._show(_pass(), as_json=False, looping=True, first=True)
    rescue._show(_pass(), as_json=False, looping=True, first=False)  # idle: nothing printed
    busy = _pass(
        mode="feed",
        window_start=2,
        window_end=5,
        versions_scanned=3,
        pending_documents=600,
        duplicates_dropped=600,
        checkpoint_before=2,
        checkpoint_after=5,
    )
    rescue._show(busy, as_json=False, looping=True, first=False)
    assert capsys.readouterr().out.splitlines() == [
        "rescue /t [default/local] mode=idle window=(-,-] versions=0 pending_docs=0 enqueued=0 "
        "already_queued=0 checkpoint=-->- lag=0v/0ms",
        "rescue /t [default/local] mode=feed window=(2,5] versions=3 pending_docs=600 enqueued=0 "
        "already_queued=600 checkpoint=2->5 lag=0v/0ms",
    ]


def test_rescue_prints_its_result_once_and_maintain_dry_run_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    ws = tmp_path / "ws"
    with (
        Outbox.open(ws, transport="memory", default_destination="shipments") as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("pkg-1", type="Package").send("Left", {})
    version = DeltaDocumentStore(str(ws / "documents")).version()  # the watermark written too
    caplog.set_level(logging.INFO)
    logging.getLogger("outbox.rescuer").setLevel(logging.NOTSET)  # whatever ran before in here
    result = CliRunner().invoke(main, ["-w", str(ws), "rescue"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1
    assert [r for r in caplog.records if r.name == "outbox.rescuer" and r.levelno < 30] == []
    assert logging.getLogger("outbox.rescuer").level == logging.NOTSET  # put back
    log_files = sorted((ws / "documents" / "_delta_log").iterdir())
    dry = CliRunner().invoke(main, ["-w", str(ws), "maintain", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.stdout)
    assert (report["checkpoint_written"], report["compacted"]) == (False, {})
    assert report["version_before"] == report["version_after"] == version
    assert sorted((ws / "documents" / "_delta_log").iterdir()) == log_files


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {"OUTBOX_DELTA_JARS": "{tmp}/jars"},
            "error: the Delta JAR {tmp}/jars/delta-spark_4.2_2.13-4.4.0.jar is empty or not a JAR "
            "file (an interrupted download?) (fix: delete it and run scripts/fetch-jars.sh again "
            "(or point OUTBOX_DELTA_JARS at good copies))",
            id="empty JARs",
        ),
        pytest.param(
            {"OUTBOX_DELTA_JARS": "{tmp}/good", "JAVA_HOME": "/nonexistent"},
            "error: JAVA_HOME=/nonexistent has no bin/java: Spark cannot start (fix: install "
            "Java 17 (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME to it, or "
            "unset JAVA_HOME to use the java on PATH)",
            id="no Java",
        ),
    ],
)
def test_spark_that_cannot_start_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    """Checked before the JVM starts (no ClassNotFoundException wall, no spark-class noise)."""
    import zipfile

    pyspark_sql = pytest.importorskip("pyspark.sql")
    # Another test in this process may hold a session; this one is about starting a new one.
    monkeypatch.setattr(pyspark_sql.SparkSession, "getActiveSession", staticmethod(lambda: None))
    ws = tmp_path / "ws"
    Outbox.open(ws, transport="memory").close()
    for folder, empty in (("jars", True), ("good", False)):
        (tmp_path / folder).mkdir()
        for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
            if empty:
                (tmp_path / folder / name).write_bytes(b"")
            else:
                with zipfile.ZipFile(tmp_path / folder / name, "w") as z:
                    z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    result = CliRunner().invoke(
        main,
        ["-w", str(ws), "rescue", "--engine", "spark"],
        env={k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()},
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [expected.replace("{tmp}", str(tmp_path))]


def test_check_prints_each_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The checker's narration (its summary last) reaches the operator once: on stdout in text,
    as log lines with --json; never both."""
    import json

    from outbox.app.checker import run as checker_run
    from outbox.app.checker.report import CheckReport

    def fake_run_check(seed: int, root: Path, *, progress: Any, **_k: Any) -> CheckReport:
        report = CheckReport(seed=seed, scenario="fake", invariants={"I1 no loss": True})
        progress("scenario: fake")
        progress(report.summary())
        return report

    monkeypatch.setattr(checker_run, "run_check", fake_run_check)
    caplog.set_level(logging.INFO)
    argv = ["check", "--seeds", "1", "--minutes", "0", "--workdir", str(tmp_path)]
    text = CliRunner().invoke(main, argv)
    summary = CheckReport(seed=1, scenario="fake", invariants={"I1 no loss": True}).summary()
    assert text.stdout.count(summary) == 1, text.output
    assert [r for r in caplog.records if summary in r.getMessage()] == []
    caplog.clear()
    as_json = CliRunner().invoke(main, [*argv, "--json"])
    [seed] = json.loads(as_json.stdout)["seeds"]
    assert (seed["seed"], seed["invariants"]) == (1, {"i1_no_loss": True})  # the --json key style
    assert [r.getMessage() for r in caplog.records].count(summary) == 1


def test_status_and_queue_stats_report_the_same_queue_fields(tmp_path: Path) -> None:
    import json

    from dispatcher.queue import QueueMessage, SqlQueue

    ws = tmp_path / "ws"
    Outbox.open(ws, transport="memory").close()
    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        queue.send("shipments", QueueMessage(body=b"{}", message_id="m-1"))
    status = json.loads(CliRunner().invoke(main, ["-w", str(ws), "status", "--json"]).stdout)
    stats = json.loads(CliRunner().invoke(main, ["-w", str(ws), "queue", "stats", "--json"]).stdout)
    assert status["queues"] == stats  # one shape: a list of objects, each naming its queue
    assert [(q["queue"], q["active"]) for q in stats] == [("shipments", 1)]


def test_status_names_queues_nobody_receives_from(tmp_path: Path) -> None:
    """Without declared destinations a typo commits and fills a queue no one reads: status
    names it once its oldest message has waited a lock duration without being received."""
    from datetime import UTC, timedelta

    from dispatcher.queue import QueueMessage, SqlQueue
    from outbox.app.cli.status import _print_status
    from outbox.app.status import collect_status
    from outbox.core.settings import Settings

    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="shipments") as ob, ob.unit_of_work() as uow:
        uow.create("pkg-1", type="Package").send("Left", {}, destination="shipmnets")
        uow.create("pkg-2", type="Package").send("Left", {})
    with SqlQueue(f"sqlite:///{ws / 'outbox.db'}") as queue:
        queue.send("read", QueueMessage(body=b"{}", message_id="m-1"))
        queue.send("read", QueueMessage(body=b"{}", message_id="m-2"))
        [held] = queue.receive("read", 1)
        queue.abandon(held, 0)  # received once: someone reads this queue
    settings = Settings.load(ws)
    soon = collect_status(settings, ManualClock(datetime.now(UTC) + timedelta(seconds=5)))
    assert soon.unread_queues == []  # younger than a lock duration: a consumer may be on it
    later = collect_status(settings, ManualClock(datetime.now(UTC) + timedelta(seconds=60)))
    assert [(u.queue, u.active) for u in later.unread_queues] == [
        ("shipments", 1),
        ("shipmnets", 1),
    ]
    _print_status(later)  # the text output renders it (no repr, aligned)


def _keys(data: Any) -> Iterator[str]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield str(k)
            yield from _keys(v)
    elif isinstance(data, list):
        for v in data:
            yield from _keys(v)


def test_every_json_key_is_snake_case(tmp_path: Path) -> None:
    """One key style in every ``--json`` document, names made for people (the demo's
    invariants: tests/test_demo_story.py) and deltalake's camelCase metrics (``maintain``'s
    ``compacted``) included."""
    import json
    import re

    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="shipments") as ob, ob.unit_of_work() as uow:
        uow.create("pkg-1", type="Package").send("Left", {})
    odd = []
    for argv in (["maintain"], ["status"], ["queue", "stats"], ["rescue"], ["migrate"]):
        result = CliRunner().invoke(main, ["-w", str(ws), *argv, "--json"])
        assert result.exit_code == 0, result.output
        odd += [f"{argv[0]}: {k}" for k in _keys(json.loads(result.stdout))]
    assert [k for k in odd if not re.fullmatch(r"[a-z]+: [a-z0-9_]+", k)] == []
    assert "maintain: num_files_added" in odd

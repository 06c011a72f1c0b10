"""``outbox-rescue-spark`` finds the Delta JARs as ``outbox rescue --engine spark`` does.

Run as a plain Python program (the console script, ``python -m``), the job built a session
without them and failed 40-50 s later with a ``ClassNotFoundException``. These tests check the
session's configuration without starting a JVM: ``start_session`` is the one place a session
starts, and the check of Java and the JARs comes before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from outbox.app.spark import rescue_job
from rescuer.cdf_spark import DELTA_EXTENSION

JARS = ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")


def _jars(folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    for name in JARS:
        with zipfile.ZipFile(folder / name, "w") as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    return [str(folder / name) for name in sorted(JARS)]


def _java(tmp_path: Path) -> str:
    """A JAVA_HOME that passes the check before the JVM starts (no JVM starts here)."""
    java = tmp_path / "java" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    return str(tmp_path / "java")


def test_the_job_session_takes_the_jars_from_outbox_delta_jars(tmp_path: Path) -> None:
    jars = _jars(tmp_path / "configured")
    env = {"OUTBOX_DELTA_JARS": str(tmp_path / "configured"), "JAVA_HOME": _java(tmp_path)}
    config = rescue_job.job_session_config(env, roots=[])
    assert config["spark.jars"].split(",") == jars
    assert config["spark.sql.extensions"] == DELTA_EXTENSION


def test_the_job_session_takes_the_jars_from_the_cache_folder(tmp_path: Path) -> None:
    jars = _jars(tmp_path / "checkout" / ".cache" / "jars")
    config = rescue_job.job_session_config(
        {"JAVA_HOME": _java(tmp_path)}, roots=[tmp_path / "elsewhere", tmp_path / "checkout"]
    )
    assert config["spark.jars"].split(",") == jars


def test_under_spark_submit_the_launcher_keeps_its_jars(tmp_path: Path) -> None:
    """spark-submit started the JVM with its own ``--jars`` and master: the job adds only
    Delta's extension and catalog, and needs no JARs of its own."""
    config = rescue_job.job_session_config({"PYSPARK_GATEWAY_PORT": "4711"}, roots=[tmp_path])
    assert "spark.jars" not in config
    assert "spark.master" not in config
    assert config["spark.sql.extensions"] == DELTA_EXTENSION


def test_the_job_starts_its_session_with_the_found_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``job_session`` itself, not only its configuration: what it starts a session with."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    # Another test in this process may hold a session; this one is about starting a new one.
    monkeypatch.setattr(pyspark_sql.SparkSession, "getActiveSession", staticmethod(lambda: None))
    jars = _jars(tmp_path / "configured")
    monkeypatch.setenv("OUTBOX_DELTA_JARS", str(tmp_path / "configured"))
    monkeypatch.setenv("JAVA_HOME", _java(tmp_path))
    for launcher in ("PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION"):
        monkeypatch.delenv(launcher, raising=False)
    started: list[dict[str, str]] = []

    def start(config: dict[str, str]) -> Any:
        started.append(dict(config))
        return "session"

    monkeypatch.setattr(rescue_job, "start_session", start)
    assert rescue_job.job_session() == "session"
    [config] = started
    assert config["spark.jars"].split(",") == jars


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_job_without_jars_is_one_line_before_any_jvm(tmp_path: Path) -> None:
    """The console script with OUTBOX_DELTA_JARS naming no JAR: one error line, exit 1, at once
    (it started a Spark without Delta and failed tens of seconds later)."""
    (tmp_path / "empty").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "OUTBOX_DELTA_JARS": str(tmp_path / "empty"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "outbox.app.spark.rescue_job", "--workspace", str(tmp_path / "ws")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"error: OUTBOX_DELTA_JARS={str(tmp_path / 'empty')!r} names no delta-spark JAR (fix: "
        "run scripts/fetch-jars.sh (downloads delta-spark and delta-storage from Maven Central "
        "into .cache/jars), or set OUTBOX_DELTA_JARS to the JAR files or their folder, or run on "
        "a Databricks runtime, which has Delta built in)"
    ]
    assert done.stdout == ""


def test_the_job_json_keys_durations_in_seconds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output convention of every ``--json``: ``lag_s``, never ``lag_seconds``."""
    from rescuer.runner import PassReport

    report = PassReport(
        table_uri="/t",
        rescuer_name="default",
        engine="spark",
        mode="sweep",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        duration_s=0.5,
        delay_s=15.0,
        latest_version=2,
        checkpoint_before=None,
        checkpoint_after=2,
        window_start=None,
        window_end=2,
        versions_scanned=3,
        change_rows=0,
        documents_examined=1,
        pending_documents=0,
        commands_enqueued=0,
        duplicates_dropped=0,
        lag_versions=0,
        lag_seconds=1.5,
    )
    monkeypatch.setattr(rescue_job, "run", lambda _args: report)
    assert rescue_job.main(["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["lag_s"] == 1.5
    assert [k for k in printed if k.endswith(("_seconds", "_hours")) or k == "seconds"] == []


def test_the_job_delay_needs_a_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--delay 5`` reads as 5 ms to one person and 5 minutes to another: refused, as
    ``outbox rescue --delay 5`` is, before any session starts."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rescue_job, "job_session", lambda: pytest.fail("a session started"))
    assert rescue_job.main(["--workspace", str(tmp_path / "ws"), "--delay", "5"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: --delay: '5' has no unit (fix: say which: 5ms, 5s, 5m or 5h)"
    ]

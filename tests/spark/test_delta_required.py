"""``SparkOutbox`` refuses a SparkSession without Delta Lake at once, in one line naming the way
to a Delta-enabled session, before it creates the workspace.

Before the check, a plain session created the workspace, ran about 40 s of validation jobs and
failed in delta-spark with ``TypeError: 'JavaPackage' object is not callable``. A session without
Delta needs its own JVM (a static setting and the JARs are fixed when the JVM starts, and the
suite's session has both), so each case is a real child process with a plain local session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outbox.app.spark.session import delta_problem
from rescuer.cdf_spark import DELTA_EXTENSION

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]

CHILD = """\
import sys
from pathlib import Path
from pyspark.sql import SparkSession

builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
if sys.argv[2]:
    builder = builder.config("spark.sql.extensions", sys.argv[2])
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("OFF")
from outbox.spark import SparkOutbox
from outbox import DeltaNotConfiguredError

ws = Path(sys.argv[1])
try:
    SparkOutbox(spark, ws, transport="memory")
except DeltaNotConfiguredError as e:
    print("refused:", e)
print("workspace:", ws.exists())
"""


def _needs_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PySpark is required under CI=true: {e}")
        pytest.skip(f"PySpark is not installed: {e}")


@pytest.mark.parametrize(
    ("extensions", "missing"),
    [
        ("", f"its spark.sql.extensions lacks {DELTA_EXTENSION}"),
        (
            DELTA_EXTENSION,
            "its JVM has no io.delta.tables.DeltaTable (the Delta JARs are not loaded)",
        ),
    ],
    ids=["plain session", "extension without the JARs"],
)
def test_a_session_without_delta_is_refused_first(
    tmp_path: Path, extensions: str, missing: str
) -> None:
    _needs_pyspark()
    ws = tmp_path / "ws"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env["PYSPARK_PYTHON"] = sys.executable
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ws), extensions],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert out["refused"] == (
        f"SparkOutbox needs a SparkSession with Delta Lake, and this one has none: {missing} "
        "(fix: pass a session with Delta Lake: outbox.spark.local_session() starts a local one "
        "(with the Delta JARs from scripts/fetch-jars.sh or OUTBOX_DELTA_JARS), delta-spark's "
        "configure_spark_with_delta_pip(builder) sets up yours, and a Databricks runtime has "
        "Delta built in (docs/spark.md))"
    )
    assert out["workspace"] == "False"  # nothing created


def test_the_suites_session_has_delta(spark: Any) -> None:
    assert delta_problem(spark) is None


def test_local_session_returns_the_active_delta_session(spark: Any) -> None:
    from outbox.spark import local_session

    assert local_session() is spark

"""``SparkOutbox`` refuses a SparkSession without Delta Lake at once, in one line naming the way
to a Delta-enabled session, before it creates the workspace.

Before the check, a plain session created the workspace, ran about 40 s of validation jobs and
failed in delta-spark with ``TypeError: 'JavaPackage' object is not callable``. A session without
Delta needs a JVM of its own (the JARs are fixed when the JVM starts, and the suite's session
has them), so the cases run in a real child process: one JVM without the JARs for both, each case
a session of its own (``spark.sql.extensions`` is a static setting: the first session is stopped
and the second built with the extension, as a user's second try would be). One JVM start, not
two: about 40 s of a loaded machine each.
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
from tests.spark.jvm import child_jvm_env

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]

CHILD = """\
import sys
from pathlib import Path
from pyspark.sql import SparkSession
from outbox.spark import SparkOutbox
from outbox import DeltaNotConfiguredError

root = Path(sys.argv[1])
for case, extensions in enumerate(sys.argv[2:]):
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    if extensions:
        builder = builder.config("spark.sql.extensions", extensions)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    ws = root / f"ws{case}"
    try:
        SparkOutbox(spark, ws, transport="memory")
    except DeltaNotConfiguredError as e:
        print(f"refused {case}:", e)
    print(f"workspace {case}:", ws.exists())
    spark.stop()
"""

#: (spark.sql.extensions, what the refusal names), in the order the child builds the sessions.
CASES = {
    "plain session": ("", f"its spark.sql.extensions lacks {DELTA_EXTENSION}"),
    "extension without the JARs": (
        DELTA_EXTENSION,
        "its JVM has no io.delta.tables.DeltaTable (the Delta JARs are not loaded)",
    ),
}


def _needs_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PySpark is required under CI=true: {e}")
        pytest.skip(f"PySpark is not installed: {e}")


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both cases, run once in one child process: ``refused N`` and ``workspace N`` lines."""
    _needs_pyspark()
    root = tmp_path_factory.mktemp("delta-required")
    env = child_jvm_env({k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env["PYSPARK_PYTHON"] = sys.executable
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), *(e for e, _ in CASES.values())],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=root,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines())


@pytest.mark.xdist_group("delta-required")  # one worker, so the module's child runs once
@pytest.mark.parametrize("case", list(CASES))
def test_a_session_without_delta_is_refused_first(refusals: dict[str, str], case: str) -> None:
    n = list(CASES).index(case)
    missing = CASES[case][1]
    assert refusals[f"refused {n}"] == (
        f"SparkOutbox needs a SparkSession with Delta Lake, and this one has none: {missing} "
        "(fix: pass a session with Delta Lake: outbox.spark.local_session() starts a local one "
        "(with the Delta JARs from scripts/fetch-jars.sh or OUTBOX_DELTA_JARS), delta-spark's "
        "configure_spark_with_delta_pip(builder) sets up yours, and a Databricks runtime has "
        "Delta built in (docs/spark.md))"
    )
    assert refusals[f"workspace {n}"] == "False"  # nothing created


def test_the_suites_session_has_delta(spark: Any) -> None:
    assert delta_problem(spark) is None


def test_local_session_returns_the_active_delta_session(spark: Any) -> None:
    from outbox.spark import local_session

    assert local_session() is spark

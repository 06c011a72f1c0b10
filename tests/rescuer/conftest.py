"""Rescuer fixtures: tables written by deltalake, read by either engine, with time injected.

Delta commit timestamps are real wall time, so tests set the ``ManualClock`` relative to the
real commit timestamps (``at(version, +delay)``) instead of sleeping. ``Table`` and ``DELAY``
live in the testing kit (the rescuer-engine contract uses them); they are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from outbox.testing.contracts.rescuer_engine import DELAY
from outbox.testing.tables import Table

__all__ = ["DELAY", "Table"]

JARS_DIR = Path("/tmp/dj")
HOW_TO_ENABLE = (
    "to run the Spark tests, run scripts/test.sh (it fetches the Delta JARs into .cache/jars) "
    "or set OUTBOX_DELTA_JARS to a folder holding delta-spark_*.jar and delta-storage-*.jar"
)


def in_ci() -> bool:
    """CI sets ``CI=true``: there a test that cannot run is a failure, never a silent skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def spark_unavailable(reason: str) -> NoReturn:
    """Fail under CI, skip elsewhere, saying how to enable the Spark tests either way."""
    if in_ci():
        pytest.fail(f"Spark cannot start under CI=true: {reason} ({HOW_TO_ENABLE})")
    pytest.skip(f"Spark cannot start here: {reason}; {HOW_TO_ENABLE}")


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """ONE local SparkSession for the whole test session (it takes ~6-8 s to start)."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        spark_unavailable(f"PySpark is not installed ({e}); install the 'spark' extra")
    from rescuer.cdf_spark import find_jars, get_spark

    try:
        jars = find_jars()
        if not jars and JARS_DIR.is_dir():
            jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
        spark = get_spark(jars=jars or None)
    except Exception as e:  # EngineError (no JARs), a JVM that will not start, ...
        spark_unavailable(f"{type(e).__name__}: {e}")
    yield spark
    spark.stop()


@pytest.fixture
def table(tmp_path: Path) -> Table:
    return Table(tmp_path / "documents")

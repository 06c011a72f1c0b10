"""Spark write-path fixtures: ONE SparkSession for the whole test session, small tables.

Under ``CI=true`` a Spark that cannot start (no PySpark, no Delta JARs) FAILS the run: the Spark
write path is part of the product, and a skipped suite proves nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.core.clock import ManualClock

JARS_DIR = Path("/tmp/dj")


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"Spark is required under CI=true: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's SparkSession (the rescuer tests' one, when they ran first)."""
    try:
        import delta  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        _unavailable(f"PySpark/delta-spark are not installed: {e}")
    from outbox.core.errors import EngineError
    from rescuer.cdf_spark import find_jars, get_spark

    jars = find_jars()
    if not jars and JARS_DIR.is_dir():
        jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
    try:
        session = get_spark(jars=jars or None)
    except EngineError as e:
        _unavailable(f"no Spark with Delta: {e}")
    yield session
    session.stop()


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport()


@pytest.fixture
def sob(spark: Any, tmp_path: Path, transport: InMemoryTransport, clock: ManualClock) -> Any:
    """A SparkOutbox on a fresh 4-bucket workspace, publishing to memory."""
    from outbox.app.spark import SparkOutbox

    ob = SparkOutbox(
        spark,
        tmp_path / "ws",
        transport=transport,
        clock=clock,
        buckets=4,
        compact_every=0,
        default_destination="shipments",
    )
    yield ob
    ob.close()

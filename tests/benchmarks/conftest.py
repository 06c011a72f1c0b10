"""The servers the benchmarks' smoke runs need, provided as the rest of the suite provides them.

PostgreSQL is the suite's own ``pg_url`` (tests/conftest.py). The broker, Azurite, moto's S3
server and the SparkSession are started here the way tests/mqtt/conftest.py,
tests/objectstore/conftest.py and tests/rescuer/conftest.py start theirs (those fixtures are not
visible from this folder); the Spark fixture keeps the name ``spark_session``, so
tests/conftest.py runs its tests on the one xdist worker that holds the JVM. The object-store
servers are passed to the benchmarks by URL (``--azurite``, ``--s3``): one start per worker for
both benchmarks that use them, instead of one per benchmark run. Unlike
tests/objectstore/conftest.py's, these fixtures leave this process's ``AZURITE_BLOB_STORAGE_URL``
alone: deltalake reads it at each call, and the object-store tests on the same worker set it to
their own server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.mqtt.broker import MosquittoServer
from tests.objectstore.servers import MOTO_MISSING, Azurite, MotoS3, azurite_bin, moto_bin

JARS_DIR = Path("/tmp/dj")


def _unavailable(why: str) -> NoReturn:
    """Fail under CI (a benchmark that cannot run there proves nothing), skip elsewhere."""
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"required under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def mqtt_url() -> Iterator[str]:
    """A mosquitto on 127.0.0.1 for the session, or the broker in OUTBOX_TEST_MQTT_URL."""
    external = os.environ.get("OUTBOX_TEST_MQTT_URL")
    if external:
        yield external
        return
    server = MosquittoServer()
    if not server.available:
        _unavailable("mosquitto is not installed here (scripts/ensure-mosquitto.sh installs it)")
    server.start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def azurite_url() -> Iterator[str]:
    """An Azurite on 127.0.0.1 for the session, for the benchmarks' ``--azurite``."""
    binary = azurite_bin()
    if binary is None:
        _unavailable("Azurite is not installed; run scripts/ensure-azurite.sh")
    server = Azurite(binary)
    server.start()
    try:
        yield server.url
    finally:
        # Its data is thrown away: no graceful close, which takes Azurite 10 s once it has
        # served requests (SIGTERM, then SIGKILL after stop's 10 s).
        if server._proc is not None:
            server._proc.kill()
        server.stop()


@pytest.fixture(scope="session")
def s3_url() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 for the session, for the benchmarks' ``--s3``."""
    binary = moto_bin()
    if binary is None:
        _unavailable(MOTO_MISSING)
    server = MotoS3(binary)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The process's SparkSession with Delta (the one the rescuer and Spark tests use when they
    ran first on this worker)."""
    try:
        import delta  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        _unavailable(f"PySpark/delta-spark are not installed: {e}")
    from rescuer.cdf_spark import find_jars, get_spark

    try:
        jars = find_jars() or sorted(str(p) for p in JARS_DIR.glob("*.jar"))
        spark = get_spark(jars=jars or None)
    except Exception as e:  # EngineError (no JARs), a JVM that will not start, ...
        _unavailable(f"Spark cannot start here: {type(e).__name__}: {e}")
    yield spark
    spark.stop()

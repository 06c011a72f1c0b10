"""Shared fixtures: an injected clock, a workspace, SQL URLs for SQLite and a real PostgreSQL."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.testing import crash_points as _crash_points
from tests.pg import PostgresServer

#: ``--fast`` (scripts/test.sh --fast): the inner loop's lane, a deselection of this suite.
pytest_plugins = ["tests.fastlane"]

_db_counter = itertools.count()

# Every dispatcher and worker our tests build reports its steps to the kit's crash points, so a
# test can arm one; production code runs with dispatcher.hooks.NO_HOOK.
_crash_points.install()


#: Fixtures that start a JVM in the test process: their tests share one xdist worker, so one
#: SparkSession serves them. (Tests whose JVMs run in child processes - spark-submit, a killed
#: driver, the Spark writer - are left to xdist: they balance the long Spark group.)
_SPARK_FIXTURES = {"spark", "spark_session", "spark_for_checker", "sob"}
#: Fixtures behind which a process pool runs the checker's seeds (several at a time).
_SEED_FIXTURES = {"ci_seed", "pg_seed"}
#: The suite's Spark settings (``spark-defaults.conf``): see ``spark_test_settings``.
SPARK_CONF_DIR = Path(__file__).resolve().parent / "spark_conf"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``) the tests that
    start Spark run on one worker and the checker's seed pools on one worker: a second JVM would
    cost its start-up and memory, and a seed pool submits every collected seed, so a pool on
    each worker ran all of them twice. Without xdist the marks change nothing."""
    loadgroup = bool(config.getoption("loadgroup", False))  # set on an xdist worker only
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("engine") == "spark":
            names.add("spark_session")  # the engine fixture asks for the session at run time
        if names & _SPARK_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif names & _SEED_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("checker-seeds"))
        if loadgroup:
            _join_group(item)


def _join_group(item: pytest.Item) -> None:
    """What ``--dist loadgroup`` itself does, done here: the group's name as the node id's
    ``@`` suffix, which the controller groups by. xdist 3.8 sets ``item._nodeid``, which
    pytest 9 no longer reads (the id is ``item._id``), and its hook runs before this one (the
    marks are added here), so no test was grouped: both workers started a JVM and a seed pool
    each, and each pool ran all 50 seeds (measured: ``checker-seeds0`` on both workers)."""
    groups = sorted(
        {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
    )
    if not groups or "@" in item.nodeid.rpartition("]")[2]:
        return  # not grouped, or xdist already suffixed it
    new_id = f"{item.nodeid}@{'_'.join(groups)}"
    if hasattr(item, "_id"):  # pytest >= 9
        from _pytest.nodeid import coerce_node_id

        setattr(item, "_id", coerce_node_id(new_id))  # noqa: B010 - a private attribute
    else:  # pragma: no cover - pytest 8, where xdist's own hook works
        setattr(item, "_nodeid", new_id)  # noqa: B010


@pytest.fixture(scope="session", autouse=True)
def spark_test_settings() -> str:
    """Every Spark the suite starts reads ``tests/spark_conf/spark-defaults.conf``: the suite's
    session (whichever module's fixture starts it first: the benchmarks', the checker's, the
    rescuer's or the write path's), and, through the environment they inherit, the child
    drivers and spark-submit. Set before any test runs, so before the session's JVM starts.
    A ``SPARK_CONF_DIR`` already set wins (an empty folder measures Spark without them)."""
    return os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF_DIR))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "ws"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer | str]:
    """A PostgreSQL server for this test session (or the one in OUTBOX_TEST_PG_URL)."""
    external = os.environ.get("OUTBOX_TEST_PG_URL")
    if external:
        yield external
        return
    server = PostgresServer()
    if not server.available:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed; scripts/test.sh installs it")
        pytest.skip("PostgreSQL is not installed here (scripts/test.sh installs it)")
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pg_url(pg_server: PostgresServer | str) -> str:
    """A fresh, empty PostgreSQL database per test."""
    if isinstance(pg_server, str):
        return pg_server
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every SQL-backed contract test runs against SQLite and a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'outbox.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(scope="session")
def kafka() -> Iterator[Any]:
    """A real Apache Kafka 4.4 (KRaft, one node) on 127.0.0.1, started once per test worker
    from the JARs ``scripts/fetch-kafka.sh`` fetched (``testkit.kafka.KafkaBroker``).
    Missing JARs, Java or confluent-kafka fail under ``CI=true`` and skip elsewhere."""
    from tests.local_server import unavailable

    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        unavailable("confluent-kafka is not installed; scripts/setup.sh --dev installs it")
    from testkit.kafka import KafkaBroker

    broker = KafkaBroker()
    if not broker.available:
        unavailable("the Kafka broker's JARs or Java are missing; run scripts/fetch-kafka.sh")
    broker.start()
    try:
        yield broker
    finally:
        broker.cleanup()


@pytest.fixture
def topic(kafka: Any) -> str:
    """A fresh Kafka topic with 4 partitions."""
    import uuid

    name: str = kafka.create_topic(f"t-{uuid.uuid4().hex[:12]}")
    return name

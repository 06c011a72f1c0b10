"""The checker on the real parts: the command queue and the rescuer's checkpoints on a PostgreSQL
server (``outbox check --sql URL``: a database per seed), the rescuer's passes on the Spark
engine (``outbox check --engine spark``: one SparkSession for every pass and seed), and a Spark
driver among the writers (``outbox check --writer spark``: its own JVM, in a child process).

Both must FAIL, not skip, under ``CI=true`` when their server or Spark cannot start (the
``pg_server`` fixture and ``spark_for_checker`` below follow the suite's pattern).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outbox.app.checker.report import CheckReport
from outbox.app.checker.run import run_check
from outbox.app.checker.scenario import Scenario
from tests.e2e.conftest import CheckPool, RunSeed, seed_runner
from tests.pg import PostgresServer

#: The PostgreSQL mode's seed: the mode is what this proves (the queue and checkpoints on a
#: server, a database per seed, dropped after); the fault breadth is test_checker's seeds' and
#: the soak's. Two seeds until issue 43's suite time.
MODE_SEEDS = [1]
#: The Spark engine's seeds: each pass is a JVM job; the engine's own contract suite runs on
#: Spark too, so two seeds stand for the end-to-end mode. Seed 1 (the heaviest plan, 33 s on the
#: local engine) took 109-163 s on Spark after the coalesced watermarks and pushed the suite past
#: its 15 minutes. One seed since the suite passed 40 minutes (issue 42's close): the engines'
#: contract suite and the rescuer's cross-engine test carry the rest. `outbox check --engine spark
#: --seeds 1` still runs the others.
SPARK_ENGINE_SEEDS = [3]
SCALE = 0.5
JARS_DIR = Path("/tmp/dj")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _holds(report: CheckReport) -> None:
    """What every CI seed must show (as ``test_checker``), whatever it ran on."""
    assert report.ok, report.summary()
    assert report.unfired_faults == [], report.to_dict()
    assert report.rescue_commands > 0, report.to_dict()  # see test_checker.py
    assert report.first_by_immediate + report.first_by_worker == report.committed
    assert report.deliveries == report.committed + report.duplicates
    assert report.lost == report.out_of_order == report.phantoms == report.mismatched == []
    assert report.rescue_errors == []


@pytest.fixture(scope="session")
def pg_seed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pg_server: PostgresServer | str,
    check_pool: CheckPool,
) -> Iterator[RunSeed]:
    """The PostgreSQL seed, in the CI seeds' pool (``check_pool``): a pool of its own started
    two processes and their fork servers for one seed (issue 43's suite time)."""
    url = pg_server if isinstance(pg_server, str) else pg_server.url
    yield from seed_runner(
        request,
        tmp_path_factory,
        name="checker-pg",
        test_name="test_seed_on_postgresql",
        kwargs={"scale": SCALE, "drain_timeout": 60, "sql": url},
        shared=check_pool,
    )


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", MODE_SEEDS)
def test_seed_on_postgresql(seed: int, pg_seed: RunSeed, pg_server: PostgresServer | str) -> None:
    report = pg_seed(seed)
    assert report.sql == "postgresql"
    _holds(report)
    if isinstance(pg_server, PostgresServer):  # the seed's own database was dropped
        import psycopg

        dsn = f"host=127.0.0.1 port={pg_server.port} user=outbox dbname=postgres"
        with psycopg.connect(dsn) as c:
            names = [r[0] for r in c.execute("SELECT datname FROM pg_database").fetchall()]
        assert not [n for n in names if n.startswith(f"outbox_check_{seed}_")], names


@pytest.fixture(scope="session")
def spark_for_checker() -> Any:
    """The process's SparkSession with Delta: the checker's Spark engine reuses it."""
    why = ""
    try:
        import delta  # noqa: F401
        import pyspark  # noqa: F401

        from rescuer.cdf_spark import find_jars, get_spark

        jars = find_jars()
        if not jars and JARS_DIR.is_dir():
            jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
        session = get_spark(jars=jars or None)
    except Exception as e:  # ImportError, EngineError (no JARs), a JVM that will not start
        why = f"{type(e).__name__}: {e}"
    if why:
        if _in_ci():
            pytest.fail(f"Spark is required under CI=true: {why}")
        pytest.skip(f"Spark cannot start here: {why}; run scripts/test.sh (it fetches the JARs)")
    return session  # the suite's other Spark fixtures stop it at the end of the session


@pytest.mark.slow
@pytest.mark.spark
# 600: the Spark group's first test pays the JVM start in its setup (85 s on a loaded box), and
# a timeout inside a py4j call breaks the session every later Spark test in the group shares
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", SPARK_ENGINE_SEEDS)
def test_seed_on_spark(seed: int, spark_for_checker: Any, tmp_path: Path) -> None:
    report = run_check(seed, tmp_path, scale=SCALE, drain_timeout=60, engine="spark")
    assert report.engine == "spark"
    _holds(report)


#: Seed 548's Spark writer is killed after its last batch's commit: one JVM start per seed (a
#: kill in an earlier batch restarts the driver, a second JVM; ``outbox check --writer spark``
#: runs those seeds, e.g. seed 1), and only the rescuer can deliver that batch's messages on the
#: writer's own documents. It was seed 12 at scale 0.5 (three Python writers, two workers, four
#: crash points beside the JVM); 548 at the smallest scale (every writer's least, 3 rounds) keeps
#: the least a Spark writer's seed has, two batches (one MERGE racing the Python writers' commits
#: on the one bucket), with two Python writers, one worker, one crash point, a worker kill and an
#: outage (issue 43's suite time).
SPARK_WRITER_SEEDS = [548]
SPARK_WRITER_SCALE = 0.25


@pytest.fixture(scope="session")
def spark_writer_parts() -> None:
    """What the Spark writer's child process needs (PySpark, delta-spark, the Delta JARs, a
    java): checked here without starting a JVM in the test process."""
    import shutil

    why = ""
    try:
        import delta  # noqa: F401
        import pyspark  # noqa: F401

        from rescuer.cdf_spark import find_jars

        if not find_jars():
            why = "no Delta JARs (OUTBOX_DELTA_JARS or .cache/jars)"
        elif not (shutil.which("java") or os.environ.get("JAVA_HOME")):
            why = "no java on PATH and no JAVA_HOME"
    except Exception as e:  # ImportError, EngineError (OUTBOX_DELTA_JARS names no JAR)
        why = f"{type(e).__name__}: {e}"
    if why:
        if _in_ci():
            pytest.fail(f"Spark is required under CI=true: {why}")
        pytest.skip(f"a Spark writer cannot start here: {why}; run scripts/test.sh")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", SPARK_WRITER_SEEDS)
def test_seed_with_a_spark_writer(seed: int, spark_writer_parts: None, tmp_path: Path) -> None:
    report = run_check(seed, tmp_path, scale=SPARK_WRITER_SCALE, drain_timeout=60, writer="spark")
    assert report.writer == "spark"
    _holds(report)
    plan = Scenario.from_seed(seed, scale=SPARK_WRITER_SCALE, writer="spark").spark
    assert plan is not None
    # its crash right after a batch's commit was planned and fired (``_holds``: none unfired)
    assert report.faults[f"writer {plan.index} crash {plan.crash}"], report.faults
    assert report.spark_batches == plan.rounds, report.to_dict()
    print(
        f"{report.summary()}; Spark batches {report.spark_batches}, MERGE retries "
        f"{report.spark_commit_retries}, crashes {report.crashes}"
    )


def test_the_sql_option_takes_sqlite_or_a_postgresql_url(tmp_path: Path) -> None:
    from outbox.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="sqlite or a PostgreSQL URL"):
        run_check(1, tmp_path, sql="mysql://u@h/db")
    with pytest.raises(ConfigurationError, match="not a rescuer engine"):
        run_check(1, tmp_path, engine="duckdb")
    with pytest.raises(ConfigurationError, match="not a writer mode"):
        run_check(1, tmp_path, writer="java")

"""The rescuer as a scheduled Spark job: the entry point ``spark-submit`` runs.

    spark-submit --jars delta-spark_4.2_2.13-4.4.0.jar,delta-storage-4.4.0.jar \\
        "$(python -c 'import outbox.app.spark.rescue_job as j; print(j.__file__)')" \\
        --workspace /dbfs/outbox --json

(or ``python -m outbox.app.spark.rescue_job``, or the console script ``outbox-rescue-spark``; on
Databricks a Python wheel task calling ``outbox.app.spark.rescue_job:main``; docs/spark.md has
them all). It runs ONE rescue pass with the
Spark engine on the job's own SparkSession (``getOrCreate``: under spark-submit or on a cluster
the master, JARs and credentials come from there; run as a plain Python program, it starts the
local session of ``outbox rescue --engine spark``, with the Delta JARs found the same way), then
exits: the scheduler (cron, a Databricks job
schedule) decides how often. The checkpoint store and the command queue are the ones the
settings name, exactly as for ``outbox rescue --engine spark``; exit status 0 on success, 1 on an
``OutboxError`` (its message on stderr), so a job run shows as failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.core.durations import parse_duration, unit_keys
from outbox.core.errors import OutboxError
from outbox.core.settings import Settings
from rescuer.cdf_spark import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    delta_jars,
    local_session_config,
    start_session,
)

if TYPE_CHECKING:
    from rescuer.runner import PassReport


#: Set in the Python driver that ``spark-submit`` starts (its JVM runs already, configured by
#: the launcher: ``--jars``, ``--master``, ``--conf``), and on Databricks (Delta built in).
_LAUNCHED_BY_SPARK = ("PYSPARK_GATEWAY_PORT", "DATABRICKS_RUNTIME_VERSION")


def launched_by_spark(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in _LAUNCHED_BY_SPARK)


def job_session_config(
    env: Mapping[str, str] | None = None, roots: list[Path] | None = None
) -> dict[str, str]:
    """What the job's SparkSession is built with. Under ``spark-submit`` or on Databricks the
    launcher configured the JVM, so only Delta's extension and catalog are added. Started as a
    plain Python program (the console script, ``python -m``), nothing configured it: the job
    builds the local session ``outbox rescue --engine spark`` builds, with the JARs from
    ``OUTBOX_DELTA_JARS`` or ``.cache/jars`` (``delta_jars``). Why: without them it started a
    Spark without Delta and failed 40-50 s later with a ``ClassNotFoundException``."""
    env = os.environ if env is None else env
    if launched_by_spark(env):
        return {
            "spark.app.name": "outbox-rescuer",
            "spark.sql.extensions": DELTA_EXTENSION,
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        }
    return local_session_config(delta_jars(env, roots))


def job_session() -> Any:
    """The job's SparkSession: the active one, else one built with ``job_session_config``."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    config = job_session_config()
    if launched_by_spark(os.environ):  # the launcher's session, log level included
        return SparkSession.builder.config(map=dict(config)).getOrCreate()
    return start_session(config)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="outbox-rescue-spark", description=__doc__.splitlines()[0])
    p.add_argument("--workspace", help="outbox workspace (settings file, default table and db)")
    p.add_argument("--table-uri", help="the document table (default: from the settings)")
    p.add_argument("--sql-url", help="checkpoints and command queue (default: from the settings)")
    p.add_argument("--delay", help="only rescue changes older than this (15s..1h)")
    p.add_argument("--name", help="rescuer name: its checkpoint is kept per table and name")
    p.add_argument("--full", action="store_true", help="sweep every current row")
    p.add_argument("--json", action="store_true", help="print the pass report as JSON")
    return p.parse_args(argv)


def run(args: argparse.Namespace, spark: Any | None = None) -> PassReport:
    """One pass; returns its report. The console's history gets a sample after it."""
    from outbox.app.rescue import open_rescuer
    from outbox.app.sampling import record_sample
    from outbox.core.clock import SystemClock

    overrides = {k: v for k, v in (("table_uri", args.table_uri), ("sql_url", args.sql_url)) if v}
    settings = Settings.load(args.workspace, **overrides)
    delay = parse_duration(args.delay, name="--delay", need_unit=True) if args.delay else None
    with open_rescuer(
        settings,
        engine="spark",
        delay=delay,
        name=args.name,
        spark=spark if spark is not None else job_session(),
    ) as rescuer:
        report = rescuer.rescue_pass.run(full=args.full)
        source = f"rescuer {rescuer.rescue_pass.name}"
        record_sample(
            settings, SystemClock(), source=source, backends=rescuer.backends, store=rescuer.store
        )
        return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except OutboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(unit_keys(report.to_dict()), default=str, sort_keys=True))
    else:
        print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

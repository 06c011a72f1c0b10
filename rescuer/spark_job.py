"""The rescuer as a scheduled Spark job: the entry point ``spark-submit`` runs.

    spark-submit --jars delta-spark_4.2_2.13-4.4.0.jar,delta-storage-4.4.0.jar \\
        rescuer/spark_job.py --workspace /dbfs/outbox --json

(or ``python -m rescuer.spark_job``; on Databricks a Python wheel task calling
``rescuer.spark_job:main``; docs/spark.md has both). It runs ONE rescue pass with the
Spark engine on the job's own SparkSession (``getOrCreate``: the master, JARs and credentials
come from spark-submit or the cluster), then exits: the scheduler (cron, a Databricks job
schedule) decides how often. The checkpoint store and the command queue are the ones the
settings name, exactly as for ``outbox rescue --engine spark``; exit status 0 on success, 1 on an
``OutboxError`` (its message on stderr), so a job run shows as failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from outbox.core.clock import SystemClock
from outbox.core.durations import format_duration, parse_duration
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.settings import Settings
from rescuer.cdf_spark import DELTA_CATALOG, DELTA_EXTENSION, SparkEngine


def job_session() -> Any:
    """The job's SparkSession, with Delta's extension and catalog when it is built here."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    return (
        SparkSession.builder.appName("outbox-rescuer")
        .config("spark.sql.extensions", DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
        .getOrCreate()
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rescuer.spark_job", description=__doc__.splitlines()[0])
    p.add_argument("--workspace", help="outbox workspace (settings file, default table and db)")
    p.add_argument("--table-uri", help="the document table (default: from the settings)")
    p.add_argument("--sql-url", help="checkpoints and command queue (default: from the settings)")
    p.add_argument("--delay", help="only rescue changes older than this (15s..1h)")
    p.add_argument("--name", help="rescuer name: its checkpoint is kept per table and name")
    p.add_argument("--full", action="store_true", help="sweep every current row")
    p.add_argument("--json", action="store_true", help="print the pass report as JSON")
    return p.parse_args(argv)


def run(args: argparse.Namespace, spark: Any | None = None) -> dict[str, Any]:
    """One pass; returns the report as a dict."""
    from outbox.delta.store import DeltaDocumentStore
    from rescuer.checkpoint_factory import checkpoint_store_from_settings
    from rescuer.runner import RescuePass, check_delay
    from rescuer.sink import QueueSink

    overrides = {k: v for k, v in (("table_uri", args.table_uri), ("sql_url", args.sql_url)) if v}
    settings = Settings.load(args.workspace, **overrides)
    delay = check_delay(
        parse_duration(args.delay, name="--delay") if args.delay else settings.rescue_delay
    )
    if delay > settings.log_retention:
        raise ConfigurationError(
            f"--delay {format_duration(delay)} is longer than log_retention "
            f"({format_duration(settings.log_retention)})",
            hint="raise log_retention, or set rescue_delay instead of --delay",
        )
    clock = SystemClock()
    store = DeltaDocumentStore(
        settings.table_uri, storage_options=settings.storage_options, clock=clock
    )
    checkpoints = checkpoint_store_from_settings(settings)
    sink = QueueSink.from_settings(settings, clock=clock)
    try:
        engine = SparkEngine(
            spark if spark is not None else job_session(),
            storage_options=settings.storage_options,
        )
        rescue = RescuePass(
            store,
            engine,
            checkpoints,
            sink,
            clock=clock,
            delay=delay,
            name=args.name or settings.rescuer_name,
        )
        return rescue.run(full=args.full).to_dict()
    finally:
        for c in (sink, checkpoints, store):
            with contextlib.suppress(OutboxError):
                c.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except OutboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, default=str, sort_keys=True))
    else:
        print(
            f"rescue {report['table_uri']} mode={report['mode'] or 'idle'} "
            f"enqueued={report['commands_enqueued']} "
            f"checkpoint={report['checkpoint_before']}->{report['checkpoint_after']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

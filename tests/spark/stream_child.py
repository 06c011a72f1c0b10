"""A tiny Structured Streaming driver for the exactly-once proof (run as a child process).

``python -m tests.spark.stream_child WORKSPACE INPUT CHECKPOINT APP_ID`` reads JSON change files
from INPUT with ``trigger(availableNow=True)`` and applies each micro-batch through
``SparkOutbox.foreach_batch``. ``OUTBOX_CRASH_AT=after_commit=kill`` SIGKILLs the driver right
after the MERGE committed, before the streaming checkpoint records the batch. Each applied batch
prints one JSON line: ``{"batch": id, "version": v, "skipped": bool, "written": n}``.

``run_stream`` is the same query on a given session: the test restarts the killed query on the
suite's own SparkSession (a restart is a new query on the same checkpoint; a second driver
process would only add a JVM start).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from outbox.app.spark import ApplyResult, SparkOutbox
from outbox.testing import crash_points
from rescuer.cdf_spark import get_spark

SCHEMA = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string>>"
)


def run_stream(
    spark: Any,
    workspace: str,
    source: str,
    checkpoint: str,
    app_id: str,
    *,
    on_batch: Callable[[dict[str, Any]], None],
) -> None:
    """Run the query until its input is consumed; ``on_batch`` gets each batch's line."""

    def report(batch_id: int, r: ApplyResult) -> None:
        on_batch(
            {"batch": batch_id, "version": r.version, "skipped": r.skipped, "written": r.written}
        )

    sob = SparkOutbox(
        spark, workspace, transport="memory", compact_every=0, default_destination="scans"
    )
    try:
        query: Any = (
            spark.readStream.schema(SCHEMA)
            .json(source)
            .writeStream.foreachBatch(sob.foreach_batch(app_id, on_result=report))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        sob.close()


def main(argv: list[str]) -> None:
    workspace, source, checkpoint, app_id = argv
    crash_points.install()  # arms OUTBOX_CRASH_AT at the first hit
    spark = get_spark()
    run_stream(
        spark,
        workspace,
        source,
        checkpoint,
        app_id,
        on_batch=lambda line: print(json.dumps(line), flush=True),
    )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])

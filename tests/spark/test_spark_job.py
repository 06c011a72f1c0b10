"""The rescuer as a Spark job, run through PySpark's own ``spark-submit`` in local mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.commands import COMMAND_SUBJECT, ProcessDocument
from dispatcher.queue.sql_queue import SqlQueue
from migrations.runner import migrate
from outbox.core.model import DocumentRow, new_incarnation
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from rescuer.cdf_spark import find_jars
from tests.spark.jvm import child_jvm_env

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # a JVM of its own
def test_spark_submit_runs_one_rescue_pass(tmp_path: Path) -> None:
    jars = find_jars()
    if not jars:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("no Delta JARs for spark-submit under CI=true")
        pytest.skip("no Delta JARs (scripts/fetch-jars.sh)")
    workspace = tmp_path / "ws"
    settings = Settings.load(workspace, buckets=4)
    migrate(settings)
    store = DeltaDocumentStore(settings.table_uri)
    incarnation = new_incarnation()
    store.save(
        [DocumentWrite(DocumentRow("d1", "t", 1, {}, 2, 0, [], incarnation=incarnation), 0, -1)]
    )
    _backdate_commits(Path(settings.table_uri), seconds=3600)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = child_jvm_env({**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable})
    done = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[1]",
            "--jars",
            ",".join(jars),
            "--conf",
            "spark.ui.enabled=false",
            # the local settings ``get_spark`` uses: Spark's defaults (200 shuffle partitions,
            # 50 for Delta's snapshot) make each of the pass's small jobs hundreds of tasks
            "--conf",
            "spark.sql.shuffle.partitions=1",
            "--conf",
            "spark.default.parallelism=1",
            "--conf",
            "spark.databricks.delta.snapshotPartitions=1",
            "--conf",
            "spark.ui.showConsoleProgress=false",
            str(REPO / "outbox" / "app" / "spark" / "rescue_job.py"),
            "--workspace",
            str(workspace),
            "--full",
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["engine"], report["mode"], report["commands_enqueued"]) == ("spark", "sweep", 1)
    queue = SqlQueue(settings.sql_url)
    try:
        [msg] = queue.peek(settings.command_queue, 10)
    finally:
        queue.close()
    assert msg.subject == COMMAND_SUBJECT
    cmd = ProcessDocument.from_json(msg.body)
    assert (cmd.id, cmd.up_to_seq, cmd.incarnation) == ("d1", 2, incarnation)


def _backdate_commits(table: Path, *, seconds: int) -> None:
    """The job rescues only commits older than its delay (15 s at least). A JVM that starts
    faster than that found nothing to do, so move the commits' own timestamps back instead."""
    for log_file in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in log_file.read_text().splitlines() if line]
        for action in actions:
            info = action.get("commitInfo")
            if info and "timestamp" in info:
                info["timestamp"] -= seconds * 1000
        log_file.write_text("".join(json.dumps(a) + "\n" for a in actions))

"""The Spark readers of the current documents (issue 44 item 1): ``SparkOutbox.documents`` (now
and as of every version), the temporary view, a persistent view in the session's catalog, and
the rescuer's Spark sweep, against the model of one table taken through every state of the
layout (``testkit.table_states``) plus a foreign MERGE done by Spark. The ```python spark blocks
of docs/readers.md run here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.core.clock import ManualClock
from testkit.table_states import MODELLED, TableStates
from tests.readers import checks
from tests.readers.conftest import build_states

# The module's table (a JVM, the states, a Spark MERGE) is built in the first test's set-up, which
# pytest-timeout charges to that test: 235 s of it was seen on a loaded machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def _model(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """Spark rows in the model's shape, by id."""
    out = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        d = r.asDict()
        out[d["id"]] = {k: json.loads(d[k]) if k == "state" else d[k] for k in MODELLED}
    return out


@pytest.fixture(scope="module")
def table(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, TableStates]]:
    """The states table, then a MERGE by Spark that rewrites a document's newest row in place
    (a foreign writer), and a SparkOutbox on the workspace."""
    from delta.tables import DeltaTable

    from outbox.app.spark import SparkOutbox

    t = build_states(tmp_path_factory.mktemp("spark_states"))
    d = t.model["d"]
    source = spark.createDataFrame([("d", d["version"])], "id string, version bigint")
    (
        DeltaTable.forPath(spark, t.uri)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id AND t.version = s.version")
        .whenMatchedUpdate(set={"state": "'{\"spark\":true}'"})
        .execute()
    )
    d["state"] = {"spark": True}
    t.record("a foreign MERGE by Spark")
    sob = SparkOutbox(
        spark,
        t.ob.settings.workspace,
        transport=InMemoryTransport(),
        clock=ManualClock(),
        create=False,
        compact_every=0,
    )
    yield sob, t
    sob.close()
    t.ob.close()


def test_the_documents_frame_as_of_every_version(table: tuple[Any, TableStates]) -> None:
    sob, t = table
    for v in sorted(t.at):
        assert _model(sob.documents(as_of=v).collect()) == t.documents(v), (v, t.step_of[v])
    assert _model(sob.documents().collect()) == t.documents(max(t.at))


def test_the_python_readers_see_the_foreign_merge(table: tuple[Any, TableStates]) -> None:
    _, t = table
    latest = max(t.at)
    assert checks.as_model(t.ob.documents())["d"]["state"] == {"spark": True}
    assert checks.as_model(t.ob.documents(sorted(t.ids))) == t.documents(latest)


def test_the_temporary_view_follows_new_commits(spark: Any, table: tuple[Any, TableStates]) -> None:
    sob, t = table
    assert sob.register_view() == "documents_current"
    assert _model(spark.table("documents_current").collect()) == t.documents(max(t.at))
    t.tombstone("a")  # a commit after the view was made: the view reads it
    assert "a" not in t.documents(max(t.at))
    rows = spark.sql("SELECT * FROM documents_current").collect()
    assert _model(rows) == t.documents(max(t.at))


def test_a_persistent_view_in_the_sessions_catalog(
    spark: Any, table: tuple[Any, TableStates]
) -> None:
    """``CREATE OR REPLACE VIEW`` in the session's catalog (in memory here: one session serves
    every test; a Hive metastore takes the same statement)."""
    sob, t = table
    name = sob.register_view("outbox_documents", persistent=True, database="default")
    assert name == "default.outbox_documents"
    listed = [r.viewName for r in spark.sql("SHOW VIEWS IN default").collect()]
    assert "outbox_documents" in listed
    assert _model(spark.table(name).collect()) == t.documents(max(t.at))
    text = spark.sql(f"SHOW CREATE TABLE {name}").first()[0]
    assert "row_number() OVER (PARTITION BY id ORDER BY version DESC)" in text


def test_a_view_name_that_is_not_an_identifier_is_one_error(table: tuple[Any, TableStates]) -> None:
    from outbox.core.errors import ValidationError

    sob, _ = table
    with pytest.raises(ValidationError, match="is not a plain SQL identifier"):
        sob.register_view("documents; DROP TABLE x")
    with pytest.raises(ValidationError, match="a temporary view has no database"):
        sob.register_view("v", database="default")


def test_the_spark_sweep_runs_the_same_rule(table: tuple[Any, TableStates]) -> None:
    """The rescuer's Spark sweep (``sweep_frame``: Spark SQL over the rule's text) finds the
    documents with unsent messages, tombstones included (their last messages must leave)."""
    from rescuer.cdf_spark import sweep_frame

    sob, t = table
    found = sweep_frame(sob._reader().load(t.uri)).collect()
    everything = t.documents(max(t.at), include_deleted=True)
    assert sorted((r["id"], r["last_seq"], r["dispatched_seq"]) for r in found) == [
        (i, d["last_seq"], d["dispatched_seq"])
        for i, d in everything.items()
        if d["last_seq"] > d["dispatched_seq"]
    ]


def test_the_spark_blocks_of_the_readers_page_run(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("OUTBOX_")]:
        if name != "OUTBOX_DELTA_JARS":
            monkeypatch.delenv(name)
    page = (REPO / "docs" / "readers.md").read_text()
    python = re.findall(r"```python\n(.*?)```", page, re.S)
    blocks = re.findall(r"```python spark\n(.*?)```", page, re.S)
    assert blocks, "docs/readers.md has no python spark block"
    namespace: dict[str, object] = {"__name__": "readers", "spark": spark}
    for i, block in enumerate([*python, *blocks]):
        try:
            exec(compile(block, f"docs/readers.md block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"docs/readers.md block {i + 1} failed: {type(e).__name__}: {e}\n{block}")


#: A child program: a local session on a Hive metastore (pyspark's bundled Hive and Derby) in
#: ``warehouse``; ``create`` registers the persistent view of the workspace's table, ``read``
#: (a later session, another process) prints the ids the view shows. One core and one partition
#: (as the spark-submit test's job): each child runs a few tiny jobs after its start.
_HIVE_CHILD = """
import sys
from rescuer.cdf_spark import delta_jars, local_session_config, start_session

ws, warehouse, action = sys.argv[1:4]
spark = start_session({
    **local_session_config(delta_jars(), "local[1]"),
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.catalogImplementation": "hive",
    "spark.sql.warehouse.dir": warehouse + "/warehouse",
    "spark.hadoop.javax.jdo.option.ConnectionURL":
        "jdbc:derby:;databaseName=" + warehouse + "/metastore_db;create=true",
})
if action == "create":
    from outbox.app.spark import SparkOutbox
    with SparkOutbox(spark, ws, transport="memory", create=False) as sob:
        print(sob.register_view(persistent=True, database="default"))
else:
    print(sorted(r.id for r in spark.table("default.documents_current").collect()))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_persistent_view_in_a_hive_metastore_outlives_its_session(tmp_path: Path) -> None:
    """Two processes, one Derby metastore: the first creates the view, the second (a new
    session) reads the current documents through it by name.

    On a states table of its own (deltalake only, no Spark in this process): the module's
    ``table`` needs the suite's session, which would put this test's two child JVMs in the
    one-worker Spark group; the view's rule is proven on every state by the tests above."""
    import subprocess
    import sys

    from tests.spark.jvm import child_jvm_env

    t = build_states(tmp_path / "states")
    t.ob.close()
    env = child_jvm_env()
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"

    def child(action: str) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _HIVE_CHILD,
                str(t.ob.settings.workspace),
                str(tmp_path),
                action,
            ],
            capture_output=True,
            text=True,
            timeout=1200,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    assert child("create") == "default.documents_current"
    assert child("read") == str(sorted(t.documents(max(t.at))))

"""Both rescuer engines carry the document incarnation into their plans, so they enqueue the same
``ProcessDocument`` command ids, on a new table and on one upgraded by ``outbox migrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.commands import commands_for
from migrations.delta import ensure_table
from outbox.core.model import DocumentRow, command_id_for, message_id_for
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from rescuer.cdf_local import LocalEngine
from rescuer.planner import Engine, FeedWindow, PendingDocument
from tests.write_path.test_incarnation import legacy_table

A, A2, B = "a" * 32, "e" * 32, "b" * 32


@pytest.fixture(params=["local", pytest.param("spark", marks=pytest.mark.spark)])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each test runs on both engines, over the same deltalake-written tables."""
    if request.param == "local":
        return LocalEngine()
    from rescuer.cdf_spark import SparkEngine

    return SparkEngine(request.getfixturevalue("spark_session"))


def _put(store: DeltaDocumentStore, *rows: tuple[str, int, int, str | None]) -> int:
    """Save (id, version to write, last_seq, incarnation); version 1 creates."""
    read_at = store.refresh()
    writes = [
        DocumentWrite(DocumentRow(i, "t", v, {}, seq, 0, [], incarnation=inc), v - 1, read_at)
        for i, v, seq, inc in rows
    ]
    return store.save(writes)


def _command_ids(store: DeltaDocumentStore, pending: tuple[PendingDocument, ...]) -> list[str]:
    return [c.command_id for c in commands_for(store.table_id, "", [p.ref() for p in pending])]


def test_plans_carry_the_current_incarnation(tmp_path: Path, engine: Engine) -> None:
    uri = str(tmp_path / "documents")
    DeltaDocumentStore.create(uri, buckets=4)
    store = DeltaDocumentStore(uri)
    start = store.version()
    _put(store, ("legacy", 1, 1, None), ("a", 1, 1, A), ("b", 1, 1, B))
    end = _put(store, ("b", 2, 2, B))  # an update keeps the incarnation
    # After the window: "a" is erased and created again (a new incarnation, back at seq 1).
    store.refresh()
    store.delta_table.delete("id = 'a'")
    latest = _put(store, ("a", 1, 1, A2))

    feed = engine.plan_feed(uri, FeedWindow(start, end, latest))
    sweep = engine.plan_sweep(uri, latest)
    expected = (
        PendingDocument("a", 1, 0, A2),
        PendingDocument("b", 2, 0, B),
        PendingDocument("legacy", 1, 0, None),
    )
    assert feed.pending == expected
    assert sweep.pending == expected
    assert _command_ids(store, feed.pending) == [
        command_id_for(store.table_id, "a", 1, A2),
        command_id_for(store.table_id, "b", 2, B),
        command_id_for(store.table_id, "legacy", 1),  # a legacy row: the old command id
    ]


def test_plans_read_across_the_column_migrate_added(tmp_path: Path, engine: Engine) -> None:
    uri = str(tmp_path / "documents")
    legacy_table(uri)  # versions 0 (create) and 1 (old-1 pending at 2, old-2 dispatched)
    assert any("incarnation" in a for a in ensure_table(uri, buckets=4))  # version 2
    store = DeltaDocumentStore(uri)
    latest = _put(store, ("new-1", 1, 1, A))

    across = engine.plan_feed(uri, FeedWindow(0, latest, latest))
    assert across.pending == (PendingDocument("new-1", 1, 0, A), PendingDocument("old-1", 2, 1))
    before = engine.plan_feed(uri, FeedWindow(0, 1, latest))  # a window before the column
    assert before.pending == (PendingDocument("old-1", 2, 1),)
    assert engine.plan_sweep(uri, latest).pending == across.pending
    assert _command_ids(store, across.pending) == [
        command_id_for("legacy-tid", "new-1", 1, A),
        command_id_for("legacy-tid", "old-1", 2),
    ]


@pytest.mark.spark
def test_the_documented_spark_sql_computes_the_same_ids(spark_session: Any) -> None:
    """docs/delta.md gives the ids as Spark SQL; a Spark job must get what Python gets."""
    rows = [("tid", "dev-7", 3, None), ("tid", "dev-7", 3, A), ("t|x", "a|b", 12, B)]
    frame = spark_session.createDataFrame(
        rows, "table_id string, id string, seq long, incarnation string"
    )
    got = frame.selectExpr(
        "substr(sha2(concat_ws('|', table_id, id, cast(seq as string), incarnation), 256), 1, 32)"
        " AS message_id",
        "concat('pd-', substr(sha2(concat_ws('|', 'process', table_id, id, cast(seq as string),"
        " incarnation), 256), 1, 32)) AS command_id",
    ).collect()
    assert [(r["message_id"], r["command_id"]) for r in got] == [
        (message_id_for(t, i, s, inc), command_id_for(t, i, s, inc)) for t, i, s, inc in rows
    ]

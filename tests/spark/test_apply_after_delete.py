"""``SparkOutbox.apply`` over documents deleted through the library (issue 44, item 2): a create
over a tombstone whose last messages were sent is the new life; over an unsent one, and any
update of a tombstone, is a conflict; a Spark job's own append that leaves ``deleted`` out writes
live documents (docs/design.md, section 4, "Spark writes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.app.facade import Outbox
from outbox.core.model import message_id_for
from tests.spark.test_apply import SETTINGS, changes

pytestmark = pytest.mark.spark


def _deleted(ws: Path, *ids: str, sent: bool) -> dict[str, str | None]:
    """Create each id with a message, delete it with a last one (deferred dispatch: nothing
    sent), then, when ``sent``, mark both sent as the dispatcher would. Their incarnations."""
    with Outbox.open(ws, transport=InMemoryTransport(), dispatch="deferred", **SETTINGS) as ob:
        with ob.unit_of_work() as uow:
            for i in ids:
                uow.create(i, type="t", state={"n": 1}).send("Created", {}, destination="q")
        with ob.unit_of_work() as uow:
            for i in ids:
                doc = uow.get(i)
                assert doc is not None
                doc.send("Removed", {}, destination="q")
                uow.delete(doc)
        rows = ob.store.read(list(ids))[1]
        assert all(r.deleted and r.version == 2 for r in rows.values())
        lives = {i: r.incarnation for i, r in rows.items()}
        if sent:
            ob.store.advance_watermarks(dict.fromkeys(ids, 2), lives)
    return lives


def test_a_create_over_a_sent_tombstone_is_the_new_life(
    sob: Any, spark: Any, transport: InMemoryTransport, tmp_path: Path
) -> None:
    lives = _deleted(tmp_path / "ws", "a", "b", sent=True)
    r = sob.apply(
        changes(
            spark,
            ("a", "t2", '{"n": 9}', 0, [("Again", "x", None)]),
            ("b", "t2", '{"n": 8}', None, []),  # an upsert: the id holds no document
        )
    )
    assert (r.written, r.conflicts.count()) == (2, 0)
    rows = sob.store.read(["a", "b"])[1]
    a = rows["a"]
    assert (a.version, a.type, a.state, a.deleted) == (3, "t2", {"n": 9}, False)
    assert (a.last_seq, a.dispatched_seq) == (1, 1)  # the new life's own, sent after the commit
    assert a.incarnation not in (None, lives["a"])
    assert [m.message_id for m in transport.deliveries] == [
        message_id_for(sob.store.table_id, "a", 1, a.incarnation)
    ]
    assert (rows["b"].version, rows["b"].deleted, rows["b"].last_seq) == (3, False, 0)
    with (
        Outbox.open(tmp_path / "ws", transport="memory", dispatch="deferred", **SETTINGS) as ob,
        ob.unit_of_work() as uow,
    ):
        doc = uow.get("a")
        assert doc is not None
        assert doc.state == {"n": 9}


def test_over_an_unsent_tombstone_a_create_and_any_update_are_conflicts(
    sob: Any, spark: Any, tmp_path: Path
) -> None:
    _deleted(tmp_path / "ws", "a", sent=False)
    _deleted(tmp_path / "ws", "b", sent=True)
    r = sob.apply(
        changes(
            spark,
            ("a", "t", "{}", 0, [("Again", "x", None)]),  # its last messages are not sent
            ("b", "t", "{}", 1, []),  # an update of a deleted document, sent or not
        )
    )
    assert r.written == 0
    conflicts = sorted((c["id"], c["current_version"]) for c in r.conflicts.collect())
    assert conflicts == [("a", 2), ("b", 2)]
    rows = sob.store.read(["a", "b"])[1]  # nothing of either written (an empty MERGE may commit)
    assert {i: (row.version, row.deleted) for i, row in rows.items()} == {
        "a": (2, True),
        "b": (2, True),
    }
    assert [m.type for m in rows["a"].pending()] == ["Created", "Removed"]


def test_a_spark_append_without_the_deleted_column_writes_live_documents(
    sob: Any, spark: Any, tmp_path: Path
) -> None:
    """A Spark job's own append (the table's columns but ``deleted``): delta-spark fills the
    column with null, which reads as a live document; the library can then delete it."""
    from pyspark.sql import functions as F

    sob.apply(changes(spark, ("a", "t", '{"n": 1}', 0, [])))
    uri = sob.table_uri
    table = spark.read.format("delta").load(uri)
    foreign = (
        table.filter(F.col("id") == "a")
        .drop("deleted")
        .withColumn("id", F.lit("ext"))
        .withColumn("bucket", F.expr(f"cast(crc32('ext') % {SETTINGS['buckets']} as int)"))
        .withColumn("incarnation", F.lit("e" * 32))
    )
    foreign.write.format("delta").mode("append").save(uri)
    raw = spark.read.format("delta").load(uri).filter(F.col("id") == "ext").collect()
    assert [r["deleted"] for r in raw] == [None]
    row = sob.store.read(["ext"])[1]["ext"]
    assert (row.deleted, row.state, row.incarnation) == (False, {"n": 1}, "e" * 32)
    with Outbox.open(tmp_path / "ws", transport="memory", dispatch="deferred", **SETTINGS) as ob:
        with ob.unit_of_work() as uow:
            doc = uow.get("ext")
            assert doc is not None
            uow.delete(doc)
        assert ob.store.read(["ext"])[1]["ext"].deleted is True

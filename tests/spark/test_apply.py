"""``SparkOutbox.apply``: one commit, the Python path's ids, conflicts as data, I4, dispatch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.core.model import DocumentRow, message_id_for

pytestmark = pytest.mark.spark

CHANGES = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string, headers:map<string,string>>>"
)


def changes(spark: Any, *rows: tuple[Any, ...]) -> Any:
    return spark.createDataFrame(list(rows), CHANGES)


def current(sob: Any) -> dict[str, DocumentRow]:
    _version, rows = sob.store.read(["a", "b", "c"])
    return dict(rows)


def test_one_commit_creates_updates_and_dispatches(sob: Any, spark: Any, transport: Any) -> None:
    before = sob.store.refresh()
    r = sob.apply(
        changes(
            spark,
            (
                "a",
                "shipment",
                '{"n": 1}',
                None,
                [("Created", '{"x":1}', {"k": "v"}), ("B", "t", None)],
            ),
            ("b", "shipment", '{"n": 2}', 0, []),
        )
    )
    assert r.version == before + 1
    assert r.rows == 2
    assert r.written == 2
    assert r.conflicts.count() == 0
    rows = current(sob)
    a = rows["a"]
    assert (a.version, a.last_seq, a.state, a.type) == (1, 2, {"n": 1}, "shipment")
    assert a.incarnation is not None
    assert len(a.incarnation) == 32
    # The ids are the Python write path's, for this table, id, seq and incarnation.
    assert [m.message_id for m in a.outbox] == [
        message_id_for(sob.store.table_id, "a", s, a.incarnation) for s in (1, 2)
    ]
    assert a.outbox[0].headers == {"k": "v"}
    assert a.outbox[1].content_type == "text/plain"
    assert a.outbox[0].ordering_key == "a"
    assert a.outbox[0].destination == "shipments"
    # Dispatched after the commit: sent in seq order, watermark advanced in one MERGE.
    assert [m.message_id for m in transport.deliveries] == [m.message_id for m in a.outbox]
    assert r.dispatch is not None
    assert r.dispatch.ok
    assert r.messages == 2
    assert sob.store.read(["a"])[1]["a"].dispatched_seq == 2

    # An update continues last_seq, keeps the incarnation and never writes dispatched_seq.
    r2 = sob.apply(changes(spark, ("a", "shipment", None, 1, [("Moved", "m", None)])))
    a2 = sob.store.read(["a"])[1]["a"]
    assert (a2.version, a2.last_seq, a2.dispatched_seq, a2.state) == (2, 3, 3, {"n": 1})
    assert a2.incarnation == a.incarnation
    assert transport.deliveries[-1].message_id == message_id_for(
        sob.store.table_id, "a", 3, a.incarnation
    )
    assert r2.written == 1


def test_conflicts_are_data_and_the_rest_commits(sob: Any, spark: Any, transport: Any) -> None:
    sob.apply(changes(spark, ("a", "t", "{}", None, []), ("b", "t", "{}", None, [])))
    r = sob.apply(
        changes(
            spark,
            ("a", "t", '{"v": 2}', 1, [("M", "x", None)]),  # right version: written
            ("b", "t", '{"v": 2}', 7, [("M", "x", None)]),  # stale: a conflict
            ("c", "t", '{"v": 2}', 3, []),  # does not exist: a conflict
        )
    )
    assert r.written == 1
    assert r.version is not None
    got = {
        row["id"]: (row["expected_version"], row["current_version"])
        for row in r.conflicts.collect()
    }
    assert got == {"b": (7, 1), "c": (3, None)}
    rows = current(sob)
    assert rows["a"].version == 2
    assert rows["b"].version == 1
    assert "c" not in rows
    assert rows["b"].last_seq == 0


def test_a_create_of_an_existing_id_is_a_conflict(sob: Any, spark: Any) -> None:
    sob.apply(changes(spark, ("a", "t", "{}", None, [])))
    r = sob.apply(changes(spark, ("a", "t", "{}", 0, [("M", "x", None)])))
    assert r.written == 0
    assert [(c["id"], c["current_version"]) for c in r.conflicts.collect()] == [("a", 1)]


def test_the_watermark_is_never_lowered_and_sent_messages_never_return(
    sob: Any, spark: Any, transport: InMemoryTransport
) -> None:
    sob.apply(changes(spark, ("a", "t", "{}", None, [("M1", "x", None)])), dispatch="deferred")
    assert transport.deliveries == []
    sob.store.advance_watermarks({"a": 1})  # the dispatcher sent seq 1 meanwhile
    sob.apply(changes(spark, ("a", "t", "{}", None, [("M2", "y", None)])), dispatch="deferred")
    a = sob.store.read(["a"])[1]["a"]
    assert a.dispatched_seq == 1
    assert [m.seq for m in a.outbox] == [2]


def test_struct_state_and_struct_body_become_json(sob: Any, spark: Any, transport: Any) -> None:
    df = spark.createDataFrame(
        [("a", "t", (1, "x"), [("M", (5,))])],
        "id string, type string, state struct<n:int, s:string>, "
        "messages array<struct<type:string, body:struct<k:int>>>",
    )
    sob.apply(df)
    a = sob.store.read(["a"])[1]["a"]
    assert a.state == {"n": 1, "s": "x"}
    assert json.loads(a.outbox[0].body) == {"k": 5}
    assert a.outbox[0].content_type == "application/json"


def test_an_empty_batch_commits_nothing(sob: Any, spark: Any) -> None:
    before = sob.store.refresh()
    r = sob.apply(changes(spark))
    assert r.version is None
    assert r.rows == 0
    assert sob.store.refresh() == before

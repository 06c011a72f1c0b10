"""``SparkOutbox.apply``: one commit, the Python path's ids, conflicts as data, I4, dispatch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.app.facade import Outbox
from outbox.app.spark import merge as M
from outbox.core.model import DocumentRow, message_id_for
from outbox.delta.versions import MARK_VERSION

pytestmark = pytest.mark.spark

CHANGES = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string, headers:map<string,string>>>"
)


#: The ``sob`` fixture's settings, for a Python ``Outbox`` on the same workspace.
SETTINGS: dict[str, Any] = {"buckets": 4, "compact_every": 0, "default_destination": "shipments"}


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


# --- the versions layout (outbox.delta.versions): a row per document version ------------------


def _python_saves(ws: Path, *ids: str) -> dict[str, str | None]:
    """Two Python saves of each id (version 1 sends M1, version 2 sends M2, each a row of its
    own), then the dispatcher's mark for M1, landing after version 2 was saved: the document's
    watermark (1) is above its newest row's own (0). Their incarnations."""
    with Outbox.open(ws, transport=InMemoryTransport(), dispatch="deferred", **SETTINGS) as ob:
        for n in (1, 2):
            with ob.unit_of_work() as uow:
                for i in ids:
                    doc = uow.get(i) or uow.create(i, type="t", state={"n": 0})
                    doc.state["n"] = n
                    doc.send(f"M{n}", {"n": n}, destination="shipments")
        lives = {i: r.incarnation for i, r in ob.store.read(list(ids))[1].items()}
        ob.store.advance_watermarks(dict.fromkeys(ids, 1), lives)
    return lives


def _version_rows(sob: Any, doc_id: str) -> list[tuple[int, int, int, str | None]]:
    """The raw version rows of one document, mark rows left out: (version, last_seq,
    dispatched_seq, incarnation)."""
    sob.store.refresh()
    rows = sob.store.delta_table.to_pyarrow_table(
        columns=["id", "version", "last_seq", "dispatched_seq", "incarnation"]
    ).to_pylist()
    return sorted(
        (r["version"], r["last_seq"], r["dispatched_seq"], r["incarnation"])
        for r in rows
        if r["id"] == doc_id and r["version"] > MARK_VERSION
    )


@pytest.mark.parametrize("expected", [2, None], ids=["expected-version", "upsert"])
def test_an_apply_updates_only_the_newest_version(
    sob: Any, spark: Any, transport: InMemoryTransport, tmp_path: Path, expected: int | None
) -> None:
    """A document saved twice by Python has two rows; an apply (with its version, or an upsert)
    updates the newest one only, carries the document's watermark into it (so the dispatch after
    the commit sends M2 and M3, never M1 again), and the document reads right afterwards."""
    lives = _python_saves(tmp_path / "ws", "a")
    assert _version_rows(sob, "a") == [(1, 1, 0, lives["a"]), (2, 2, 0, lives["a"])]
    r = sob.apply(changes(spark, ("a", "t", '{"n": 3}', expected, [("M3", "z", None)])))
    assert (r.written, r.conflicts.count()) == (1, 0)
    # version 1's row is untouched; version 2's became version 3, in place, with the watermark
    assert _version_rows(sob, "a") == [(1, 1, 0, lives["a"]), (3, 3, 1, lives["a"])]
    ids = [message_id_for(sob.store.table_id, "a", s, lives["a"]) for s in (2, 3)]
    assert [m.message_id for m in transport.deliveries] == ids
    a = sob.store.read(["a"])[1]["a"]
    assert (a.version, a.last_seq, a.dispatched_seq, a.state) == (3, 3, 3, {"n": 3})
    assert a.incarnation == lives["a"]
    assert a.pending() == []


def test_a_stale_expected_version_on_several_rows_is_a_conflict(
    sob: Any, spark: Any, tmp_path: Path
) -> None:
    """The expected version is checked against the document's newest version, not any row."""
    lives = _python_saves(tmp_path / "ws", "a")
    r = sob.apply(changes(spark, ("a", "t", "{}", 1, [("M3", "z", None)])))
    assert r.written == 0
    assert [
        (c["id"], c["expected_version"], c["current_version"]) for c in r.conflicts.collect()
    ] == [("a", 1, 2)]
    assert _version_rows(sob, "a") == [(1, 1, 0, lives["a"]), (2, 2, 0, lives["a"])]


def _racing(monkeypatch: pytest.MonkeyPatch, race: Callable[[], None]) -> list[int]:
    """Run ``race`` (a concurrent writer) once, after the apply read the newest versions and
    before its MERGE; returns the MERGE attempts made."""
    real = M.run_merge
    attempts: list[int] = []

    def run_merge(*args: Any, **kwargs: Any) -> dict[str, int]:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            race()
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "run_merge", run_merge)
    return attempts


def test_a_version_appended_after_the_read_is_never_overwritten(
    sob: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python save appends version 3 of "a" and creates "c" between the apply's read of the
    newest versions and its MERGE: the MERGE sees rows it did not read and fails (nothing
    committed); the retry reads again and updates version 3 (an upsert) and "c". A superseded
    row is never updated, and no version is written twice."""
    lives = _python_saves(tmp_path / "ws", "a")

    def save() -> None:
        with (
            Outbox.open(tmp_path / "ws", transport="memory", dispatch="deferred", **SETTINGS) as ob,
            ob.unit_of_work() as uow,
        ):
            uow.get("a").send("Py", {"n": 3}, destination="shipments")
            uow.create("c", type="t").send("Py", {}, destination="shipments")

    attempts = _racing(monkeypatch, save)
    before = sob.commit_retries
    r = sob.apply(
        changes(
            spark,
            ("a", "t", None, None, [("M4", "z", None)]),
            ("c", "t", None, None, [("M2", "z", None)]),
        )
    )
    assert _version_rows(sob, "a") == [
        (1, 1, 0, lives["a"]),
        (2, 2, 0, lives["a"]),
        (4, 4, 1, lives["a"]),  # version 3 (the racing save's), updated in place
    ]
    assert [v for v, *_ in _version_rows(sob, "c")] == [2]
    assert attempts == [1, 2]
    assert sob.commit_retries == before + 1
    assert (r.written, r.conflicts.count()) == (2, 0)
    docs = sob.store.read(["a", "c"])[1]
    assert (docs["a"].version, docs["a"].last_seq, docs["a"].dispatched_seq) == (4, 4, 4)
    assert (docs["c"].version, docs["c"].last_seq, docs["c"].dispatched_seq) == (2, 2, 2)


def test_an_expected_version_superseded_after_the_read_is_a_conflict(
    sob: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read saw version 2, as the apply expected; a Python save appended version 3 before
    the MERGE. The retry finds version 3: a conflict, and nothing of "a" is written."""
    _python_saves(tmp_path / "ws", "a")

    def save() -> None:
        with (
            Outbox.open(tmp_path / "ws", transport="memory", dispatch="deferred", **SETTINGS) as ob,
            ob.unit_of_work() as uow,
        ):
            uow.get("a").state["py"] = 1

    attempts = _racing(monkeypatch, save)
    r = sob.apply(changes(spark, ("a", "t", "{}", 2, [("M3", "z", None)])))
    assert [v for v, *_ in _version_rows(sob, "a")] == [1, 2, 3]
    assert r.written == 0
    assert [(c["id"], c["current_version"]) for c in r.conflicts.collect()] == [("a", 3)]
    assert attempts == [1, 2]
    assert sob.store.read(["a"])[1]["a"].state == {"n": 2, "py": 1}


def test_an_id_with_only_mark_rows_holds_no_document(sob: Any, spark: Any, tmp_path: Path) -> None:
    """A mark that lands after its document was deleted leaves a mark row alone: no document.
    A create there inserts a new life (the old life's mark covers none of its messages), and
    the mark row is never updated."""
    lives = _python_saves(tmp_path / "ws", "a")
    sob.store.refresh()
    sob.store.delta_table.delete("id = 'a'")  # erased outside the library
    assert sob.store.advance_watermarks({"a": 2}, lives) is not None  # a late mark
    assert sob.store.read(["a"])[1] == {}
    r = sob.apply(changes(spark, ("a", "t", "{}", 0, [("New", "x", None)])), dispatch="deferred")
    assert (r.written, r.conflicts.count()) == (1, 0)
    a = sob.store.read(["a"])[1]["a"]
    assert (a.version, a.last_seq, a.dispatched_seq) == (1, 1, 0)
    assert a.incarnation not in (None, lives["a"])
    marks = [
        (r["version"], r["dispatched_seq"], r["incarnation"])
        for r in sob.store.delta_table.to_pyarrow_table().to_pylist()
        if r["id"] == "a" and r["version"] == MARK_VERSION
    ]
    assert marks == [(MARK_VERSION, 2, lives["a"])]

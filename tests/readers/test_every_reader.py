"""Every Python reader of the current documents against the model of one table taken through
every state of the layout (issue 44 item 1): ``ob.documents`` (all, by ids, by type, as of a
version and a time), a user's DataFusion and polars queries over ``current_sql``, and the rule's
two forms against each other. The readers of the table *now* (``store.read``, the pending sweep,
``ob.documents`` without ``as_of``) are checked after every step of a run of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import outbox
from outbox.core.clock import ManualClock
from outbox.delta import reads
from testkit.table_states import DELETED, MODELLED, STEPS, TableStates
from tests.readers import checks
from tests.write_path.conftest import bare_outbox


def test_the_table_passes_through_every_state(states: TableStates) -> None:
    """The builder made what it claims: raw rows of several versions, mark rows (one of a life
    that ended), null incarnations, two lives of one id, tombstones, and documents hidden."""
    rows = states.ob.store._query("SELECT * FROM t").to_pylist()
    marks = [r for r in rows if r["version"] == 0]
    assert {r["id"] for r in marks} >= {"a", "b", "c"}
    assert any(r["incarnation"] is None for r in rows)
    assert len({r["incarnation"] for r in rows if r["id"] == "b"}) == 2
    assert {r["id"] for r in rows if r.get(DELETED)} == {"c", "e"}
    assert len({r["incarnation"] for r in rows if r["id"] == "e" and r["version"] > 0}) == 2
    assert len(states.at) > 25
    latest = max(states.at)
    assert sorted(states.documents(latest)) == ["a", "b", "d", "e", "old"]
    assert sorted(states.documents(latest, include_deleted=True)) == [
        "a",
        "b",
        "c",
        "d",
        "e",
        "old",
    ]
    assert [name for name, _ in STEPS][-1] == "re-create over a tombstone"


def test_every_document_as_of_every_version(states: TableStates) -> None:
    checks.check_all_documents(states)


def test_documents_by_id_as_of_every_version(states: TableStates) -> None:
    checks.check_documents_by_id(states)


def test_documents_by_type_as_of_every_version(states: TableStates) -> None:
    checks.check_documents_by_type(states)


def test_documents_as_of_a_time(states: TableStates) -> None:
    checks.check_documents_by_time(states)


def test_a_users_datafusion_query_over_the_generated_sql(states: TableStates) -> None:
    checks.check_datafusion(states)


def test_polars_sql_over_scan_delta(states: TableStates) -> None:
    checks.check_polars(states)


def test_the_arrow_rule_equals_the_sql_rule_on_every_version(states: TableStates) -> None:
    checks.check_arrow_equals_sql(states)


def test_the_readers_of_the_table_now_after_every_step(tmp_path: Path) -> None:
    """After each step: ``ob.documents`` (all, by ids, with tombstones), the store's own read
    (tombstones included: their last messages must still leave) and the pending sweep."""
    t = TableStates(bare_outbox(tmp_path / "ws", ManualClock(), buckets=4))

    def check(step: str) -> None:
        v = t.ob.store.refresh()
        want, everything = t.documents(v), t.documents(v, include_deleted=True)
        assert checks.as_model(t.ob.documents()) == want, step
        assert checks.as_model(t.ob.documents(sorted(t.ids))) == want, step
        with_tombstones = t.ob.documents(include_deleted=True)
        assert checks.as_model(with_tombstones, include_deleted=True) == everything, step
        _, rows = t.ob.store.read(sorted(t.ids))
        read = {i: {k: getattr(r, k) for k in MODELLED} for i, r in sorted(rows.items())}
        assert read == {i: {k: d[k] for k in MODELLED} for i, d in everything.items()}, step
        pending = t.ob.store.scan_pending(["id", "last_seq", "dispatched_seq"]).to_pylist()
        assert sorted((p["id"], p["last_seq"], p["dispatched_seq"]) for p in pending) == [
            (i, d["last_seq"], d["dispatched_seq"])
            for i, d in everything.items()
            if d["last_seq"] > d["dispatched_seq"]
        ], step

    try:
        t.run(check)
    finally:
        t.ob.close()


def test_read_documents_opens_a_workspace_or_a_table(states: TableStates) -> None:
    want = states.documents(max(states.at))
    by_table = outbox.read_documents(states.uri)
    by_workspace = outbox.read_documents(states.ob.settings.workspace)
    assert checks.as_model(by_table) == checks.as_model(by_workspace) == want
    old = outbox.read_documents(states.uri, ["a", "b"], as_of=3, columns=["id", "version"])
    assert old.column_names == ["id", "version"]
    assert old.to_pylist() == [
        {"id": i, "version": d["version"]}
        for i, d in states.documents(3).items()
        if i in ("a", "b")
    ]


def test_pandas_and_polars_are_one_call_away(states: TableStates) -> None:
    import polars as pl

    table = states.ob.documents(columns=["id", "type", "version", "state"])
    frame = table.to_pandas()
    assert list(frame["id"]) == sorted(states.documents(max(states.at)))
    assert pl.from_arrow(table).columns == ["id", "type", "version", "state"]
    assert json.loads(frame.set_index("id").loc["a", "state"]) == {"n": 3}


def test_the_columns_asked_for_in_that_order_deleted_never_null(states: TableStates) -> None:
    latest = max(states.at)
    for ids in (None, sorted(states.ids)):
        table = states.ob.documents(ids, columns=["version", "id"], include_deleted=True)
        assert table.column_names == ["version", "id"]
        flags = states.ob.documents(ids, columns=["id", DELETED], include_deleted=True)
        assert flags.to_pylist() == [
            {"id": i, DELETED: d[DELETED]}
            for i, d in states.documents(latest, include_deleted=True).items()
        ]
    before = states.ob.documents(as_of=3, columns=["id", DELETED], include_deleted=True)
    assert before.schema.field(DELETED).type == pa.bool_()  # no column yet: false, not null
    assert set(before[DELETED].to_pylist()) == {False}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"columns": ["id", "colour"]}, "unknown document column(s) 'colour'"),
        ({"columns": "id"}, "columns must be a list of column names, got the string 'id'"),
        ({"ids": "a"}, "ids must be a list of document ids (strings), got 'a'"),
        ({"as_of": True}, "as_of must be a table version (int), a datetime or ISO 8601 text"),
        ({"as_of": "yesterday"}, "as_of 'yesterday' is neither a table version nor an ISO"),
        ({"as_of": 10_000}, "as_of version 10000 is not a version of"),
    ],
)
def test_a_wrong_argument_is_one_clear_error(
    states: TableStates, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(outbox.ValidationError) as caught:
        states.ob.documents(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    assert "(fix: " in str(caught.value)


def test_a_version_or_time_before_the_kept_history_names_the_oldest_readable(
    tmp_path: Path,
) -> None:
    """The log trim deletes the commits before a checkpoint; an as-of read from before it is
    ``HistoryGoneError``, one line naming the oldest readable version and ``log_retention``;
    that version and later ones still read."""
    from datetime import UTC, datetime, timedelta

    from outbox.core.durations import format_duration
    from outbox.delta.log import trim_log

    ob = bare_outbox(tmp_path / "ws", ManualClock(), buckets=4)
    try:
        t = TableStates(ob)
        for n in range(3):
            t.save("a", {"n": n}, type="Order")
        kept = ob.store.refresh()
        ob.store.delta_table.create_checkpoint()
        for n in range(3, 5):
            t.save("a", {"n": n})
        ob.store.refresh()
        ob.store.delta_table.create_checkpoint()
        report = trim_log(
            ob.store.uri,
            now=datetime.now(UTC) + timedelta(days=1),
            retention=timedelta(minutes=15),
            needed=None,
        )
        assert report.keep_from == kept
        assert reads.oldest_readable(ob.store.uri) == kept
        for gone in (0, kept - 1, datetime(2020, 1, 1, tzinfo=UTC)):
            with pytest.raises(outbox.HistoryGoneError) as caught:
                ob.documents(as_of=gone)
            said = str(caught.value)
            assert f"the oldest readable version is {kept}" in said
            assert f"log_retention ({format_duration(ob.settings.log_retention)})" in said
            assert "\n" not in said
        for v in (kept, kept + 1, max(t.at)):
            assert checks.as_model(ob.documents(as_of=v)) == t.documents(v)
            assert checks.as_model(ob.documents(["a"], as_of=v)) == t.documents(v)
    finally:
        ob.close()

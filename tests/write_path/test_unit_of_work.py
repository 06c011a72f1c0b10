"""The write path: documents and their messages in one Delta commit, all or nothing."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from outbox import ClosedError, ConcurrencyError, Outbox
from outbox.core.errors import (
    MessageTooLargeError,
    SerializationError,
    ValidationError,
)
from outbox.core.model import message_id_for
from outbox.testing.tables import current_rows
from tests.write_path.conftest import bare_outbox


def _rows(ob: Outbox) -> dict[str, dict[str, object]]:
    return current_rows(ob.store.delta_table)


def test_readme_flow_creates_then_updates(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.get("shipment-42") or uow.create(
            "shipment-42", type="Shipment", state={"status": "created"}
        )
        doc.state["status"] = "left-seattle"
        doc.send("ShipmentStatusChanged", {"status": "left-seattle"}, destination="shipments")
    row = _rows(ob)["shipment-42"]
    assert row["version"] == 1
    assert row["last_seq"] == 1
    assert row["dispatched_seq"] == 0
    assert row["state"] == '{"status":"left-seattle"}'
    [msg] = row["outbox"]
    assert msg["seq"] == 1
    assert msg["message_id"] == message_id_for(
        ob.store.table_id, "shipment-42", 1, row["incarnation"]
    )
    assert msg["ordering_key"] == "shipment-42"
    assert msg["destination"] == "shipments"

    with ob.unit_of_work() as uow:
        doc = uow.get("shipment-42")
        assert doc is not None
        assert doc.version == 1
        doc.state["status"] = "reached-des-moines"
        doc.send("ShipmentStatusChanged", {"status": "reached-des-moines"}, destination="shipments")
    row = _rows(ob)["shipment-42"]
    assert row["version"] == 2
    assert [m["seq"] for m in row["outbox"]] == [1, 2]


def test_many_documents_and_messages_are_one_commit(ob: Outbox) -> None:
    before = ob.store.refresh()
    with ob.unit_of_work() as uow:
        for i in range(5):
            d = uow.create(f"doc-{i}", type="T", state={"i": i})
            for k in range(3):
                d.send("E", {"k": k}, destination="q")
    assert uow.committed_version == before + 1
    assert ob.store.refresh() == before + 1
    rows = _rows(ob)
    assert len(rows) == 5
    assert all(r["last_seq"] == 3 and len(r["outbox"]) == 3 for r in rows.values())


def test_exception_in_block_commits_nothing(ob: Outbox) -> None:
    before = ob.store.refresh()

    def fail_inside() -> None:
        with ob.unit_of_work() as uow:
            uow.create("a", type="T").send("E", {}, destination="q")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fail_inside()
    assert ob.store.refresh() == before
    assert _rows(ob) == {}


def test_unchanged_document_is_not_rewritten(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"x": 1})
    v = ob.store.refresh()
    with ob.unit_of_work() as uow:
        assert uow.get("a") is not None
    assert uow.committed_version is None
    assert ob.store.refresh() == v


def test_stale_document_raises_and_writes_nothing(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"n": 0})
        uow.create("b", type="T", state={"n": 0})
    first, second = ob.unit_of_work(), ob.unit_of_work()
    a1 = first.get("a")
    a2, b2 = second.get("a"), second.get("b")
    assert a1
    assert a2
    assert b2
    a1.state["n"] = 1
    first.commit()
    b2.state["n"] = 2  # a fresh document in the same unit of work...
    a2.state["n"] = 2  # ...and a stale one
    a2.send("E", {}, destination="q")
    v = ob.store.refresh()
    with pytest.raises(ConcurrencyError, match="'a' was changed"):
        second.commit()
    assert ob.store.refresh() == v
    rows = _rows(ob)
    assert rows["a"]["state"] == '{"n":1}'
    assert rows["b"]["state"] == '{"n":0}'
    assert rows["a"]["last_seq"] == 0


def test_create_existing_document_raises(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="T")
    with pytest.raises(ConcurrencyError, match="already exists"), ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"other": True})
    assert _rows(ob)["a"]["state"] == "{}"


def test_save_never_writes_dispatched_seq_nor_brings_sent_messages_back(ob: Outbox) -> None:
    """I4: the dispatcher advances the watermark between a read and a save."""
    with ob.unit_of_work() as uow:
        d = uow.create("a", type="T")
        d.send("E1", {}, destination="q")
        d.send("E2", {}, destination="q")
    uow2 = ob.unit_of_work()
    doc = uow2.get("a")
    assert doc is not None
    assert doc.dispatched_seq == 0
    assert ob.store.advance_watermarks({"a": 2}) is not None  # the dispatcher sent 1 and 2
    doc.state["x"] = 1
    doc.send("E3", {}, destination="q")
    uow2.commit()  # must not fail (I4) and must not lower the watermark
    _, rows = ob.store.read(["a"])
    row = rows["a"]
    assert row.dispatched_seq == 2
    assert [m.seq for m in row.pending()] == [3]  # 1 and 2 are not pending again
    with ob.unit_of_work() as uow3:  # the next save, having read the watermark, prunes them
        d3 = uow3.get("a")
        assert d3 is not None
        d3.state["x"] = 2
    assert [m.seq for m in ob.store.read(["a"])[1]["a"].outbox] == [3]
    # and the watermark never goes down (a lower mark is a row the versions rule reads past)
    ob.store.advance_watermarks({"a": 1})
    assert ob.store.read(["a"])[1]["a"].dispatched_seq == 2


def test_message_fields_and_deterministic_ids(ob: Outbox) -> None:
    from datetime import UTC, datetime

    when = datetime(2030, 1, 1, tzinfo=UTC)
    with ob.unit_of_work() as uow:
        d = uow.create("a", type="T")
        m = d.send(
            "E",
            "plain text",
            destination="topic/sub",
            ordering_key="customer-7",
            headers={"traceparent": "00-abc-def-01"},
            correlation_id="req-1",
            deliver_at=when,
        )
    assert m.content_type == "text/plain"
    _, rows = ob.store.read(["a"])
    [stored] = rows["a"].outbox
    assert stored == m
    assert stored.deliver_at == when
    assert stored.headers == {"traceparent": "00-abc-def-01"}
    assert m.message_id == message_id_for(ob.store.table_id, "a", 1, rows["a"].incarnation)
    assert message_id_for("t", "a", 1) == message_id_for("t", "a", 1)
    assert message_id_for("t", "a", 1) != message_id_for("t", "a", 2)
    assert message_id_for("t", "a", 1) != message_id_for("u", "a", 1)


@pytest.mark.parametrize(
    ("action", "error", "text"),
    [
        (lambda u: u.create("", type="T"), ValidationError, "document id must be a non-empty"),
        (lambda u: u.create("x" * 129, type="T"), ValidationError, "limit is 128"),
        (lambda u: u.create("a\nb", type="T"), ValidationError, "control characters"),
        (lambda u: u.create("a", type=""), ValidationError, "document type"),
        (lambda u: u.get(""), ValidationError, "document id"),
        (
            lambda u: u.create("a", type="T").send("E", {}, destination=""),
            ValidationError,
            "destination must be a non-empty",
        ),
        (
            lambda u: u.create("a", type="T").send("E", {}, destination="bad name!"),
            ValidationError,
            "not a valid queue or topic name",
        ),
        (
            lambda u: u.create("a", type="T").send("E", {}),
            ValidationError,
            "destination must be",
        ),
        (
            lambda u: u.create("a", type="T").send("E", {"when": object()}, destination="q"),
            SerializationError,
            "cannot be serialized to JSON",
        ),
        (
            lambda u: u.create("a", type="T").send("E", float("nan"), destination="q"),
            SerializationError,
            "cannot be serialized",
        ),
        (
            lambda u: u.create("a", type="T").send("E", b"\xff\xfe", destination="q"),
            SerializationError,
            "UTF-8",
        ),
        (
            lambda u: u.create("a", type="T").send("", {}, destination="q"),
            ValidationError,
            "message type",
        ),
        (
            lambda u: u.create("a", type="T").send(
                "E", {}, destination="q", deliver_at=__import__("datetime").datetime(2030, 1, 1)
            ),
            ValidationError,
            "deliver_at must be a timezone-aware datetime",
        ),
        (
            lambda u: u.create("a", type="T", state={"x": {1, 2}}),
            SerializationError,
            "state of document 'a'",
        ),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(
    ob: Outbox, action: object, error: type[Exception], text: str
) -> None:
    uow = ob.unit_of_work()
    with pytest.raises(error, match=text):
        action(uow)  # type: ignore[operator]
    uow.discard()
    assert _rows(ob) == {}


@pytest.mark.parametrize(
    ("bad", "found"), [([1, 2], "list"), (None, "NoneType"), (42, "int"), ("text", "str")]
)
def test_a_loaded_document_whose_state_is_not_an_object_is_refused_at_commit(
    ob: Outbox, bad: object, found: str
) -> None:
    """``create`` refuses such a state; a whole new ``doc.state`` on a loaded document must be
    refused too, at commit, with nothing written (not even the other document of the commit)."""
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"n": 1})
    before = _rows(ob)
    uow = ob.unit_of_work()
    uow.create("b", type="T")
    doc = uow.get("a")
    assert doc is not None
    doc.state = bad  # type: ignore[assignment]
    with pytest.raises(
        ValidationError, match=f"state of document 'a' must be a JSON object .*got {found}"
    ):
        uow.commit()
    assert _rows(ob) == before
    with ob.unit_of_work() as uow:  # a new document whose state is replaced is refused as well
        uow.create("c", type="T").state = bad  # type: ignore[assignment]
        with pytest.raises(ValidationError, match=f"document 'c' .*got {found}"):
            uow.commit()
    assert _rows(ob) == before


def test_oversized_message_is_refused(workspace: object, clock: object) -> None:
    ob = bare_outbox(workspace, clock, max_message_bytes=1024)  # type: ignore[arg-type]
    with pytest.raises(MessageTooLargeError, match="the limit is 1024"), ob.unit_of_work() as uow:
        uow.create("a", type="T").send("E", {"blob": "x" * 2000}, destination="q")
    assert _rows(ob) == {}


def test_unit_of_work_used_after_close(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        d = uow.create("a", type="T")
    with pytest.raises(ClosedError, match="unit of work is closed"):
        uow.get("a")
    with pytest.raises(ClosedError):
        d.send("E", {}, destination="q")
    with pytest.raises(ClosedError):
        uow.commit()
    ob.close()
    with pytest.raises(ClosedError, match="Outbox is closed"):
        ob.unit_of_work()


def test_default_destination_setting(workspace: object, clock: object) -> None:
    ob = bare_outbox(workspace, clock, default_destination="events")  # type: ignore[arg-type]
    with ob.unit_of_work() as uow:
        m = uow.create("a", type="T").send("E", {})
    assert m.destination == "events"


def test_save_retries_commit_conflicts_within_a_bound(ob: Outbox, monkeypatch: object) -> None:
    from deltalake.exceptions import CommitFailedError

    from outbox.core.errors import CommitConflictError
    from outbox.delta import appends

    calls = {"n": 0}
    real = appends.append

    def flaky(*a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise CommitFailedError("Transaction failed: version already exists")
        real(*a, **k)

    monkeypatch.setattr(appends, "append", flaky)  # type: ignore[attr-defined]
    with ob.unit_of_work() as uow:
        uow.create("a", type="T")
    assert calls["n"] == 3
    assert ob.store.commit_retries == 2

    def always(*a: object, **k: object) -> object:
        raise CommitFailedError("Transaction failed: version already exists")

    monkeypatch.setattr(appends, "append", always)  # type: ignore[attr-defined]
    with pytest.raises(CommitConflictError, match="after 10 retries"), ob.unit_of_work() as uow:
        uow.create("b", type="T")


def test_bucket_partition_and_literal_filter(ob: Outbox) -> None:
    from outbox.core.model import bucket_of

    with ob.unit_of_work() as uow:
        for i in range(40):
            uow.create(f"d{i}", type="T")
    t = ob.store.delta_table.to_pyarrow_table(columns=["id", "bucket"])
    for r in t.to_pylist():
        assert r["bucket"] == bucket_of(r["id"], 16)
    assert len(set(t.column("bucket").to_pylist())) > 8
    assert isinstance(t, pa.Table)


def test_reads_work_after_a_delta_checkpoint(ob: Outbox) -> None:
    """Regression: deltalake's pyarrow filters break on checkpoint stats (string vs string_view)."""
    with ob.unit_of_work() as uow:
        for i in range(5):
            uow.create(f"d{i}", type="T", state={"i": i})
    ob.store.delta_table.create_checkpoint()
    with ob.unit_of_work() as uow:
        doc = uow.get("d3")
        assert doc is not None
        assert doc.state == {"i": 3}
        doc.state["i"] = 30
    pending = ob.store.scan_pending()
    assert pending.num_rows == 0
    assert ob.store.read(["d3"])[1]["d3"].state == {"i": 30}


def test_a_finished_unit_of_work_leaves_no_reference_cycle(ob: Outbox) -> None:
    """Its documents are freed by reference counting, not left to the garbage collector (whose
    full collections of a 1,000-document unit of work's leftovers landed inside later
    dispatches). Fails when the unit of work keeps its documents after closing."""
    import gc
    import weakref

    gc.disable()
    try:
        for finish in ("commit", "discard", "raise"):
            uow = ob.unit_of_work()
            try:
                with uow:
                    doc = uow.create(f"cycle-{finish}", type="T", state={"n": 1})
                    doc.send("Created", {"n": 1}, destination="shipments")
                    if finish == "discard":
                        uow.discard()
                    elif finish == "raise":
                        raise RuntimeError("the application failed")
            except RuntimeError:
                pass
            alive = weakref.ref(doc)
            del doc, uow
            assert alive() is None, f"{finish}: the document outlived its unit of work"
    finally:
        gc.enable()


def test_the_size_limit_counts_utf8_bytes_of_body_and_properties(
    workspace: object, clock: object
) -> None:
    """Issue 29: a header of 1,000 ``é`` is 2,000 bytes on the wire; counted as characters, a
    message over the limit passed. The limit is what ``size_bytes`` counts, byte for byte."""
    ob = bare_outbox(workspace, clock, max_message_bytes=4096)  # type: ignore[arg-type]
    with ob.unit_of_work() as uow:
        msg = uow.create("a", type="T").send("E", "x", destination="q", headers={"h": "é" * 1000})
    overhead = msg.size_bytes() - 2000 - 1  # everything but the header value and the body
    assert overhead > len("h") + len("E") + 32  # the key, the type and the message id at least
    fits = 4096 - overhead - 2000  # a body that brings the message to the limit exactly
    with ob.unit_of_work() as uow:
        ok = uow.create("b", type="T").send(
            "E", "x" * fits, destination="q", headers={"h": "é" * 1000}
        )
    assert ok.size_bytes() == 4096
    with (
        pytest.raises(MessageTooLargeError, match="is 4097 bytes; the limit is 4096"),
        ob.unit_of_work() as uow,
    ):
        uow.create("c", type="T").send(
            "E", "x" * (fits + 1), destination="q", headers={"h": "é" * 1000}
        )
    assert set(_rows(ob)) == {"a", "b"}

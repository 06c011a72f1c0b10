"""Message identity survives delete and re-create (issue 11, item 8).

A document deleted outside the library (a retention or erasure job) and created again restarts at
seq 1. Its messages must not carry its predecessor's ids, or every duplicate detection downstream
drops them (a loss, I1). The row's ``incarnation``, drawn at create, tells the two lives apart;
rows written before the column existed keep their old ids exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dispatcher.commands import ProcessDocument, commands_for
from dispatcher.queue import SqlQueue
from migrations.runner import migrate
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.errors import ConcurrencyError, SchemaMismatchError
from outbox.core.model import (
    DocumentRow,
    OutboxMessage,
    bucket_of,
    command_id_for,
    message_id_for,
)
from outbox.core.settings import Settings
from outbox.delta import schema as S
from outbox.delta.store import DeltaDocumentStore, DocumentWrite

QUEUE = "devices"


def _send(ob: Outbox, doc_id: str, body: dict[str, int]) -> OutboxMessage:
    with ob.unit_of_work() as uow:
        doc = uow.get(doc_id) or uow.create(doc_id, type="Device")
        return doc.send("Whitelist", body, destination=QUEUE)


def _erase(uri: str, doc_id: str) -> None:
    """What a retention or erasure job does: a plain Delta delete, no outbox code involved."""
    DeltaTable(uri).delete(f"id = '{doc_id}'")


def _received_bodies(sql_url: str) -> list[dict[str, int]]:
    """Everything in the queue, in order (a session hands out its next message once the one
    before is settled)."""
    queue = SqlQueue(sql_url)
    bodies: list[dict[str, int]] = []
    try:
        while got := queue.receive(QUEUE, max_messages=10):
            for m in got:
                bodies.append(json.loads(m.body))
                queue.complete(m)
        return bodies
    finally:
        queue.close()


def _recreate_scenario(workspace: Path, clock: ManualClock) -> list[dict[str, int]]:
    """The reproduction through the public API; returns what the SQL queue delivers."""
    with Outbox.open(workspace, clock=clock, transport="sql") as ob:
        first = _send(ob, "dev-7", {"gen": 1})
        _erase(ob.settings.table_uri, "dev-7")
        second = _send(ob, "dev-7", {"gen": 2})
        assert (first.seq, second.seq) == (1, 1)  # the re-created document restarts at seq 1
        assert ob.runtime.metrics["send_failures"] == 0
        return _received_bodies(ob.settings.sql_url)


def test_a_recreated_document_delivers_its_new_messages(
    workspace: Path, clock: ManualClock
) -> None:
    assert _recreate_scenario(workspace, clock) == [{"gen": 1}, {"gen": 2}]


def test_without_an_incarnation_the_recreated_documents_message_is_dropped(
    workspace: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism, shown by switching the incarnation off: the same (table, id, seq) gives the
    same id, and the queue's duplicate detection drops the second life's first message."""
    monkeypatch.setattr("outbox.unit_of_work.new_incarnation", lambda: None)
    assert _recreate_scenario(workspace, clock) == [{"gen": 1}]


def test_ids_differ_per_incarnation_and_keep_the_old_formula_without_one() -> None:
    import hashlib

    legacy = hashlib.sha256(b"tid|dev-7|1").hexdigest()[:32]
    assert message_id_for("tid", "dev-7", 1) == message_id_for("tid", "dev-7", 1, None) == legacy
    assert message_id_for("tid", "dev-7", 1, "a" * 32) != legacy
    assert message_id_for("tid", "dev-7", 1, "a" * 32) != message_id_for(
        "tid", "dev-7", 1, "b" * 32
    )
    assert message_id_for("tid", "dev-7", 1, "a" * 32) == message_id_for(
        "tid", "dev-7", 1, "a" * 32
    )
    legacy_cmd = "pd-" + hashlib.sha256(b"process|tid|dev-7|3").hexdigest()[:32]
    assert command_id_for("tid", "dev-7", 3) == legacy_cmd
    assert command_id_for("tid", "dev-7", 3, "a" * 32) not in (
        legacy_cmd,
        command_id_for("tid", "dev-7", 3, "b" * 32),
    )


def test_process_document_carries_the_incarnation() -> None:
    cmd = ProcessDocument("tid", "dev-7", 3, "/t", "a" * 32)
    assert ProcessDocument.from_json(cmd.to_json()) == cmd
    assert cmd.command_id == command_id_for("tid", "dev-7", 3, "a" * 32)
    legacy = ProcessDocument("tid", "dev-7", 3, "/t")
    assert "incarnation" not in legacy.to_json()  # a legacy command's body is unchanged
    assert ProcessDocument.from_json(legacy.to_json()) == legacy
    assert legacy.command_id == command_id_for("tid", "dev-7", 3)
    assert commands_for("tid", "/t", [("dev-7", 3), ("dev-7", 3, "a" * 32)]) == [legacy, cmd]


def test_the_incarnation_is_drawn_at_create_and_kept_by_updates(ob: Outbox) -> None:
    created = _send(ob, "dev-7", {"gen": 1})
    _, rows = ob.store.read(["dev-7"])
    incarnation = rows["dev-7"].incarnation
    assert incarnation is not None
    assert len(incarnation) == 32
    assert created.message_id == message_id_for(ob.store.table_id, "dev-7", 1, incarnation)
    _send(ob, "dev-7", {"gen": 1, "n": 2})
    ob.store.advance_watermarks({"dev-7": 2})
    _, rows = ob.store.read(["dev-7"])
    assert rows["dev-7"].incarnation == incarnation
    _erase(ob.settings.table_uri, "dev-7")
    _send(ob, "dev-7", {"gen": 2})
    _, rows = ob.store.read(["dev-7"])
    assert rows["dev-7"].incarnation not in (None, incarnation)


def test_a_save_read_before_a_delete_and_recreate_is_stale(ob: Outbox) -> None:
    """The re-created document is back at version 1: the version check alone would let a save
    that read the old life overwrite the new one."""
    _send(ob, "dev-7", {"gen": 1})
    stale = ob.unit_of_work()
    doc = stale.get("dev-7")
    assert doc is not None
    assert doc.version == 1
    _erase(ob.settings.table_uri, "dev-7")
    _send(ob, "dev-7", {"gen": 2})
    doc.state["x"] = 1
    with pytest.raises(ConcurrencyError, match="deleted and created again"):
        stale.commit()
    # The MERGE's own predicate, without the snapshot re-check: a write that claims the current
    # snapshot but names the old incarnation writes nothing.
    version, rows = ob.store.read(["dev-7"])
    row = rows["dev-7"]
    old = DocumentRow(row.id, row.type, 2, {"x": 1}, row.last_seq, 0, [], incarnation="0" * 32)
    with pytest.raises(ConcurrencyError):
        ob.store.save([DocumentWrite(old, row.version, version)])
    _, after = ob.store.read(["dev-7"])
    assert after["dev-7"].state == row.state
    assert after["dev-7"].version == row.version


# --- tables created before the column ----------------------------------------------------------


def _legacy_row(table_id: str, doc_id: str, last_seq: int, dispatched: int) -> dict[str, object]:
    """A row as the previous release wrote it (no incarnation; ids from (table, id, seq))."""
    return {
        "id": doc_id,
        "type": "Device",
        "version": 1,
        "state": "{}",
        "last_seq": last_seq,
        "dispatched_seq": dispatched,
        "outbox": [
            {
                "seq": s,
                "message_id": message_id_for(table_id, doc_id, s),
                "destination": QUEUE,
                "type": "Whitelist",
                "body": json.dumps({"seq": s}),
                "content_type": "application/json",
                "headers": None,
                "ordering_key": doc_id,
                "correlation_id": None,
                "deliver_at": None,
                "created_at": None,
            }
            for s in range(dispatched + 1, last_seq + 1)
        ],
        "updated_at": None,
        "bucket": bucket_of(doc_id, 4),
    }


def legacy_table(uri: str, table_id: str = "legacy-tid") -> None:
    """A document table in the pre-incarnation layout, with data and the change feed on."""
    DeltaTable.create(
        uri,
        schema=S.LEGACY_SCHEMA,
        partition_by=["bucket"],
        description=S.describe_table(1, 4, table_id),
        configuration={S.CDF_PROPERTY: "true"},
    )
    dt = DeltaTable(uri)
    rows = [_legacy_row(table_id, "old-1", 2, 1), _legacy_row(table_id, "old-2", 1, 1)]
    (
        dt.merge(
            pa.Table.from_pylist(rows, schema=S.LEGACY_SCHEMA),
            predicate="t.id = s.id",
            source_alias="s",
            target_alias="t",
        )
        .when_not_matched_insert_all()
        .execute()
    )


def test_migrate_upgrades_a_legacy_table_and_its_rows_keep_their_ids(
    workspace: Path, clock: ManualClock
) -> None:
    settings = Settings(workspace=workspace, buckets=4)
    workspace.mkdir(parents=True)
    legacy_table(settings.table_uri)
    before = DeltaTable(settings.table_uri)
    files, protocol = sorted(before.file_uris()), before.protocol()
    assert S.describe_mismatch(pa.schema(before.schema().to_arrow())) is None  # ours, not foreign
    with pytest.raises(SchemaMismatchError, match="run `outbox migrate`"):
        DeltaDocumentStore(settings.table_uri)

    report = migrate(settings)
    assert any("added the 'incarnation' column" in a for a in report.actions)
    assert migrate(settings).actions == []  # idempotent
    after = DeltaTable(settings.table_uri)
    assert sorted(after.file_uris()) == files  # metadata only: no data file rewritten
    assert after.protocol() == protocol
    assert pa.schema(after.schema().to_arrow()).names == S.DOCUMENT_SCHEMA.names

    with Outbox.open(settings=settings, clock=clock, transport="sql") as ob:
        _, rows = ob.store.read(["old-1", "old-2"])
        assert {r.incarnation for r in rows.values()} == {None}
        [pending] = rows["old-1"].outbox
        assert pending.message_id == message_id_for("legacy-tid", "old-1", 2)
        # A new message on an old row keeps the old formula...
        sent = _send(ob, "old-1", {"seq": 3})
        assert sent.message_id == message_id_for("legacy-tid", "old-1", 3)
        # ...while a document created, or re-created, now gets an incarnation and new ids.
        new = _send(ob, "new-1", {"seq": 1})
        _erase(settings.table_uri, "old-2")
        reborn = _send(ob, "old-2", {"seq": 1})
        _, rows = ob.store.read(["old-1", "new-1", "old-2"])
        assert rows["old-1"].incarnation is None
        for doc_id, msg in (("new-1", new), ("old-2", reborn)):
            incarnation = rows[doc_id].incarnation
            assert incarnation is not None
            assert msg.message_id == message_id_for("legacy-tid", doc_id, 1, incarnation)
            assert msg.message_id != message_id_for("legacy-tid", doc_id, 1)
        bodies = _received_bodies(settings.sql_url)
    assert {"seq": 3} in bodies
    assert bodies.count({"seq": 1}) == 2


def test_the_change_feed_reads_across_the_added_column(workspace: Path) -> None:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True)
    legacy_table(uri)
    migrate(Settings(workspace=workspace, buckets=4))
    store = DeltaDocumentStore(uri)
    row = DocumentRow("new-1", "Device", 1, {}, 1, 0, [], incarnation="c" * 32)
    store.save([DocumentWrite(row, 0, store.version())])
    dt = DeltaTable(uri)
    columns = ["id", "incarnation", "_change_type", "_commit_version"]

    def feed(start: int, end: int | None = None) -> list[tuple[object, ...]]:
        reader = dt.load_cdf(starting_version=start, ending_version=end, columns=columns)
        rows = pa.RecordBatchReader.from_stream(reader).read_all().to_pylist()
        return sorted((str(r["id"]), r["incarnation"], int(r["_commit_version"])) for r in rows)

    # versions 2 to 5: the transaction retention set, the two columns added, the schema
    # version recorded (all metadata only)
    assert feed(0) == [("new-1", "c" * 32, 6), ("old-1", None, 1), ("old-2", None, 1)]
    assert feed(1, 1) == [("old-1", None, 1), ("old-2", None, 1)]  # a range before the column

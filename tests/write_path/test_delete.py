"""Deletes through the library (issue 44, item 2): ``uow.delete`` writes a tombstone version that
carries the document's last messages, races saves as a save does, is removed by the fold once its
messages left, and governs what a create of the id may do (docs/design.md, section 2).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from migrations.delta import ensure_table
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    ConcurrencyError,
    DocumentNotFoundError,
    SchemaMismatchError,
    ValidationError,
)
from outbox.core.model import DocumentRow, bucket_of, message_id_for, new_incarnation
from outbox.delta import schema as S
from outbox.delta.fold import due, fold_table, superseded_share
from outbox.delta.store import DeltaDocumentStore
from outbox.testing.crash_points import InjectedCrash, crash_points
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import QueueSink
from tests.write_path.conftest import bare_outbox
from tests.write_path.test_versions import _in_step


def _raw(ob: Outbox, doc_id: str) -> list[dict[str, Any]]:
    dt = ob.store.delta_table
    dt.update_incremental()
    cols = ["id", "version", "last_seq", "dispatched_seq", "state", "type", "incarnation"]
    rows = dt.to_pyarrow_table(columns=[*cols, "deleted"]).to_pylist()
    return sorted((r for r in rows if r["id"] == doc_id), key=lambda r: r["version"])


def _device(ob: Outbox, doc_id: str = "dev-1", messages: int = 1) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.create(doc_id, type="Device", state={"name": "pump"})
        for n in range(messages):
            doc.send("Registered", {"n": n}, destination="q")


def _delete(ob: Outbox, doc_id: str = "dev-1", last: str | None = "DeviceRemoved") -> None:
    with ob.unit_of_work() as uow:
        doc = uow.get(doc_id)
        assert doc is not None
        if last is not None:
            doc.send(last, {"id": doc_id}, destination="q")
        uow.delete(doc)


def _mark_sent(ob: Outbox, doc_id: str = "dev-1") -> None:
    """What the dispatcher does once the transport took every message of the document."""
    row = ob.store.read([doc_id])[1][doc_id]
    assert ob.store.advance_watermarks({doc_id: row.last_seq}, {doc_id: row.incarnation})


def test_a_delete_is_the_next_version_a_tombstone_with_the_last_messages(ob: Outbox) -> None:
    _device(ob)
    before = ob.store.read(["dev-1"])[1]["dev-1"]
    _delete(ob)
    rows = _raw(ob, "dev-1")
    assert [(r["version"], r["deleted"], r["state"], r["type"]) for r in rows] == [
        (1, False, '{"name":"pump"}', "Device"),
        (2, True, "{}", "Device"),
    ]
    assert {r["incarnation"] for r in rows} == {before.incarnation}
    version = ob.store.refresh()
    log = Path(ob.store.uri) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines() if line]
    assert [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a] == [
        ("outbox:doc:dev-1", 2)  # the application transaction a save of it conflicts on
    ]
    tomb = ob.store.read(["dev-1"])[1]["dev-1"]  # the dispatcher's view: the tombstone
    assert (tomb.deleted, tomb.version, tomb.last_seq, tomb.dispatched_seq) == (True, 2, 2, 0)
    assert [(m.seq, m.type) for m in tomb.pending()] == [(1, "Registered"), (2, "DeviceRemoved")]
    assert tomb.outbox[1].message_id == message_id_for(
        ob.store.table_id, "dev-1", 2, before.incarnation
    )
    assert ob.store.scan_pending(columns=["id", "last_seq"]).to_pylist() == [
        {"id": "dev-1", "last_seq": 2}
    ]
    with ob.unit_of_work() as uow:  # every reader of documents: none
        assert uow.get("dev-1") is None
        assert uow.get_many(["dev-1"]) == {}


def test_after_a_delete_the_unit_of_work_refuses_the_id(ob: Outbox) -> None:
    _device(ob)
    _device(ob, "dev-2")
    with (
        pytest.raises(DocumentNotFoundError, match="'nope' does not exist"),
        ob.unit_of_work() as uow,
    ):
        uow.delete("nope")
    with ob.unit_of_work() as uow:
        doc = uow.get("dev-1")
        assert doc is not None
        uow.delete("dev-1")
        assert uow.get("dev-1") is None
        with pytest.raises(ValidationError, match="was deleted in this unit of work"):
            doc.send("Late", {}, destination="q")
        with pytest.raises(ValidationError, match="cannot be created again in it"):
            uow.create("dev-1", type="Device")
        with pytest.raises(DocumentNotFoundError, match="'dev-1' was deleted"):
            uow.delete(doc)
    with (
        pytest.raises(DocumentNotFoundError, match="'dev-1' was deleted"),
        ob.unit_of_work() as uow,
    ):
        uow.delete("dev-1")  # its tombstone is committed
    version = ob.store.refresh()
    uow = ob.unit_of_work()
    doc = uow.get("dev-2")
    assert doc is not None
    uow.delete(doc)
    doc.state["name"] = "valve"
    with pytest.raises(ValidationError, match="changed after it was deleted"):
        uow.commit()
    assert ob.store.refresh() == version  # nothing written
    assert ob.store.read(["dev-2"])[1]["dev-2"].deleted is False


def test_the_last_message_is_delivered_and_the_fold_then_removes_the_document(
    workspace: Path, clock: ManualClock
) -> None:
    memory = InMemoryTransport()
    settings: dict[str, Any] = {"buckets": 1, "compact_every": 0, "watermark_window": 0}
    with Outbox.open(workspace, clock=clock, transport=memory, **settings) as ob:
        _device(ob, messages=2)
        _delete(ob)
        assert [m.destination for m in memory.deliveries] == ["q"] * 3
        assert [json.loads(m.body) for m in memory.deliveries][-1] == {"id": "dev-1"}
        tomb = ob.store.read(["dev-1"])[1]["dev-1"]
        assert (tomb.deleted, tomb.dispatched_seq, tomb.last_seq) == (True, 3, 3)
        assert due(superseded_share(ob.store._query), at=0.2) == [0]  # all its rows go
        report = fold_table(ob.store)
        assert report.rows_removed == 4  # version 1, the tombstone and two mark rows
        assert _raw(ob, "dev-1") == []
        with ob.unit_of_work() as uow:  # the id is free: a new life, back at version 1
            uow.create("dev-1", type="Device").send("Registered", {"again": True}, destination="q")
        row = ob.store.read(["dev-1"])[1]["dev-1"]
        assert (row.version, row.deleted) == (1, False)
        assert row.incarnation != tomb.incarnation


def test_the_fold_keeps_a_tombstone_until_its_messages_are_sent(ob: Outbox) -> None:
    """Without a dispatcher the tombstone's messages stay pending: every fold keeps it (and the
    life's rows the rule reads it with); once the watermark reaches it, every row goes."""
    _device(ob)
    _delete(ob)
    fold_table(ob.store, at=0)
    assert [(r["version"], r["deleted"]) for r in _raw(ob, "dev-1")] == [(2, True)]
    assert ob.store.read(["dev-1"])[1]["dev-1"].pending()[-1].type == "DeviceRemoved"
    _mark_sent(ob)
    assert fold_table(ob.store, at=0).rows_removed == 2  # the tombstone and the mark row
    assert _raw(ob, "dev-1") == []
    assert ob.store.read(["dev-1"])[1] == {}


def _two_outboxes(workspace: Path) -> tuple[Outbox, Outbox]:
    first = bare_outbox(workspace, ManualClock())
    _device(first)
    return first, bare_outbox(workspace, ManualClock())


def _commit(uows: list[Any]) -> list[BaseException | None]:
    import threading

    errors: list[BaseException | None] = [None] * len(uows)

    def run(n: int) -> None:
        try:
            uows[n].commit()
        except BaseException as e:  # reported to the test
            errors[n] = e

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(uows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


@pytest.mark.parametrize("first", ["delete", "save"])
def test_a_delete_and_a_save_read_from_one_snapshot_race_like_two_saves(
    workspace: Path, first: str
) -> None:
    """Both read version 1. Whichever commits first wins; the other's re-check sees version 2
    and raises ``ConcurrencyError``, nothing of it written."""
    a, b = _two_outboxes(workspace)
    try:
        deleting, saving = a.unit_of_work(), b.unit_of_work()
        deleting.delete("dev-1")
        saved = saving.get("dev-1")
        assert saved is not None
        saved.state["name"] = "valve"
        winner, loser = (deleting, saving) if first == "delete" else (saving, deleting)
        winner.commit()
        with pytest.raises(ConcurrencyError, match=r"'dev-1' (was changed|was deleted)"):
            loser.commit()
        rows = _raw(a, "dev-1")
        assert [r["version"] for r in rows] == [1, 2]
        assert rows[-1]["deleted"] is (first == "delete")
    finally:
        a.close()
        b.close()


def test_a_delete_and_a_save_appending_at_once_one_wins(workspace: Path) -> None:
    """Both read version 1 and append version 2 from one snapshot (no re-check between): the
    per-document application transaction fails the later commit, whose retry re-reads and
    reports ``ConcurrencyError``. Exactly one version 2 exists, a tombstone or a save."""
    a, b = _two_outboxes(workspace)
    try:
        deleting, saving = a.unit_of_work(), b.unit_of_work()
        deleting.delete("dev-1")
        doc = saving.get("dev-1")
        assert doc is not None
        doc.state["name"] = "valve"
        _in_step(a.store, b.store)
        errors = _commit([deleting, saving])
        assert sorted(type(e).__name__ for e in errors) == ["ConcurrencyError", "NoneType"]
        assert a.store.commit_retries + b.store.commit_retries == 1
        rows = _raw(a, "dev-1")
        assert [r["version"] for r in rows] == [1, 2]
        assert rows[-1]["deleted"] is (errors[0] is None)  # the delete won, or the save did
    finally:
        a.close()
        b.close()


def test_a_create_over_an_unsent_tombstone_is_refused(ob: Outbox) -> None:
    """The new life's newer row would hide the old life's pending tail from every rule: the
    create waits until the tombstone's messages are sent."""
    _device(ob)
    _delete(ob)
    version = ob.store.refresh()
    unsent = "last messages are not sent yet"
    with pytest.raises(ConcurrencyError, match=unsent), ob.unit_of_work() as uow:
        uow.create("dev-1", type="Device")  # never read: the store's re-check refuses it
    with ob.unit_of_work() as uow:
        assert uow.get("dev-1") is None
        with pytest.raises(ConcurrencyError, match=unsent):
            uow.create("dev-1", type="Device")  # read: the unit of work refuses it at once
    assert ob.store.refresh() == version
    assert ob.store.read(["dev-1"])[1]["dev-1"].deleted is True


def test_a_create_over_a_sent_tombstone_starts_a_new_life_above_it(ob: Outbox) -> None:
    """The new life continues the numbering (the highest version stays the newest) with a new
    incarnation, so its messages never repeat the old life's ids, and the old life's mark is
    not its own."""
    _device(ob)
    _delete(ob)
    old = ob.store.read(["dev-1"])[1]["dev-1"]
    _mark_sent(ob)
    with ob.unit_of_work() as uow:  # never read: the store's re-check finds the base
        new = uow.create("dev-1", type="Sensor", state={"gen": 2})
        sent = new.send("Registered", {"gen": 2}, destination="q")
    row = ob.store.read(["dev-1"])[1]["dev-1"]
    assert (row.version, row.type, row.state, row.deleted) == (3, "Sensor", {"gen": 2}, False)
    assert (row.last_seq, row.dispatched_seq) == (1, 0)
    assert row.incarnation not in (None, old.incarnation)
    assert sent.message_id == message_id_for(ob.store.table_id, "dev-1", 1, row.incarnation)
    assert sent.message_id != old.outbox[0].message_id
    with ob.unit_of_work() as uow:
        doc = uow.get("dev-1")
        assert doc is not None
        assert doc.state == {"gen": 2}
    _delete(ob, last=None)
    _mark_sent(ob)
    with ob.unit_of_work() as uow:  # read first: the unit of work knows the base
        assert uow.get("dev-1") is None
        uow.create("dev-1", type="Device")
    assert ob.store.read(["dev-1"])[1]["dev-1"].version == 5


@pytest.fixture
def _disarmed() -> Any:
    crash_points.disarm()
    yield
    crash_points.disarm()


@pytest.mark.usefixtures("_disarmed")
def test_a_crash_after_the_delete_commits_is_delivered_by_the_rescuer_and_worker(
    workspace: Path, clock: ManualClock
) -> None:
    memory = InMemoryTransport()
    with Outbox.open(workspace, clock=clock, transport=memory, compact_every=0) as ob:
        _device(ob)
        assert len(memory.deliveries) == 1
        crash_points.arm("after_commit", at_hit=1)
        with pytest.raises(InjectedCrash):
            _delete(ob)
        assert len(memory.deliveries) == 1  # the process died before dispatching
        ts = int(ob.store.delta_table.history(1)[0]["timestamp"])
        later = ManualClock(datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(minutes=1))
        sink = QueueSink(ob.runtime.queue, ob.settings.command_queue)
        rescue = RescuePass(ob.store, LocalEngine(), InMemoryCheckpointStore(), sink, clock=later)
        assert rescue.run(full=True).commands_enqueued == 1
        DispatcherWorker(ob.runtime, batch_size=8, poll_interval=1.0).run(until_idle=True)
        assert [json.loads(m.body) for m in memory.deliveries][1:] == [{"id": "dev-1"}]
        tomb = ob.store.read(["dev-1"])[1]["dev-1"]
        assert (tomb.deleted, tomb.dispatched_seq, tomb.last_seq) == (True, 2, 2)
        fold_table(ob.store, at=0)
        assert _raw(ob, "dev-1") == []


def _v2_table(uri: str) -> list[DocumentRow]:
    """A table as the release before deletes left it: schema version 2, no ``deleted``."""
    DeltaTable.create(
        uri,
        schema=S.V2_SCHEMA,
        partition_by=["bucket"],
        description=S.describe_table(2, 4, "v2-tid"),
        configuration={S.CDF_PROPERTY: "true", **S.STATE_PROPERTIES},
    )
    rows = [
        DocumentRow(f"d{i}", "T", 1, {"i": i}, 1, 1, [], incarnation=new_incarnation())
        for i in range(3)
    ]
    table = S.table_from_rows([(r, bucket_of(r.id, 4)) for r in rows], extra={})
    write_deltalake(uri, table.drop_columns([S.DELETED]), mode="append")
    return rows


def test_migrate_adds_the_column_to_a_version_2_table_which_then_reads_the_same(
    workspace: Path,
) -> None:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True)
    written = _v2_table(uri)
    files = sorted(DeltaTable(uri).file_uris())
    with pytest.raises(SchemaMismatchError, match=r"schema version 2 .*run `outbox migrate`"):
        DeltaDocumentStore(uri)
    assert ensure_table(uri, buckets=4) == [
        f"added the 'deleted' column to {uri} (uow.delete writes a tombstone version; the rows "
        "already there are live documents)",
        f"recorded outbox schema version 3 on {uri} (deletes write a tombstone version from now "
        "on; the rows already there read the same; releases before it refuse the table)",
    ]
    assert ensure_table(uri, buckets=4) == []
    assert sorted(DeltaTable(uri).file_uris()) == files  # metadata only
    store = DeltaDocumentStore(uri)
    try:
        rows = store.read([r.id for r in written])[1]
        assert {i: (r.version, r.state, r.incarnation, r.deleted) for i, r in rows.items()} == {
            r.id: (1, r.state, r.incarnation, False) for r in written
        }
        raw = DeltaTable(uri).to_pyarrow_table(columns=["deleted"])["deleted"].to_pylist()
        assert raw == [None, None, None]  # null: live
    finally:
        store.close()
    ob = bare_outbox(workspace, buckets=4)
    try:
        _delete(ob, "d1", last=None)
        assert ob.store.read(["d1"])[1]["d1"].deleted is True
    finally:
        ob.close()


def test_a_table_of_a_later_schema_version_is_refused(workspace: Path) -> None:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True)
    DeltaDocumentStore.create(uri, buckets=4)
    DeltaTable(uri).alter.set_table_description(S.describe_table(4, 4, "tid"))
    with pytest.raises(SchemaMismatchError, match=r"schema version 4; .* up to 3"):
        DeltaDocumentStore(uri)


def test_a_foreign_append_with_a_null_deleted_is_a_live_document(ob: Outbox) -> None:
    row = DocumentRow("ext", "T", 1, {"by": "spark"}, 0, 0, [], incarnation=new_incarnation())
    table = S.table_from_rows([(row, ob.store.bucket("ext"))], extra={})
    nulls = pa.nulls(1, pa.bool_())
    table = table.set_column(table.schema.get_field_index(S.DELETED), S.DELETED, nulls)
    write_deltalake(ob.store.uri, table, mode="append")
    with ob.unit_of_work() as uow:
        doc = uow.get("ext")
        assert doc is not None
        assert doc.state == {"by": "spark"}
        uow.delete(doc)
    assert ob.store.read(["ext"])[1]["ext"].deleted is True


DELTA_MD = Path(__file__).resolve().parents[2] / "docs" / "delta.md"


def test_a_foreign_delete_meeting_a_mark_append_retries_as_the_docs_say(ob: Outbox) -> None:
    """A retention job's DELETE on a handle opened before the dispatcher's mark append: the
    documented failure, then the documented retry (docs/delta.md's block, run as it is)
    deletes every row of the life, the mark rows that caused the conflict included."""
    from deltalake.exceptions import CommitFailedError

    found = re.search(r"```python foreign-delete\n(.*?)```", DELTA_MD.read_text(), flags=re.S)
    assert found is not None
    namespace: dict[str, Any] = {"__name__": "delta_md"}
    exec(compile(found.group(1), "docs/delta.md foreign-delete block", "exec"), namespace)
    delete_document = namespace["delete_document"]
    _device(ob)
    _device(ob, "dev-2")
    life = ob.store.read(["dev-1"])[1]["dev-1"].incarnation
    assert life is not None
    bucket = ob.store.bucket("dev-1")
    stale = DeltaTable(ob.store.uri)
    _mark_sent(ob)  # the dispatcher's mark row lands after the job's snapshot
    with pytest.raises(CommitFailedError, match="concurrent transaction"):
        stale.delete(f"bucket = {bucket} AND id = 'dev-1' AND incarnation = '{life}'")
    assert [r["version"] for r in _raw(ob, "dev-1")] == [0, 1]  # nothing was deleted
    stale = DeltaTable(ob.store.uri)
    _mark_sent(ob)
    assert delete_document(stale, bucket, "dev-1", life) == 2
    assert _raw(ob, "dev-1") == []
    assert ob.store.read(["dev-1", "dev-2"])[1].keys() == {"dev-2"}


def test_a_create_right_after_a_delete_in_this_process_needs_no_wait(
    workspace: Path, clock: ManualClock
) -> None:
    """The delete's last message went out with its commit; its mark may still wait in this
    process's watermark writer. A create of the id (read first or not) writes it and goes on."""

    def create(ob: Outbox, read_first: bool) -> ConcurrencyError | None:
        try:
            with ob.unit_of_work() as uow:
                if read_first:
                    assert uow.get("dev-1") is None
                uow.create("dev-1", type="Device")
        except ConcurrencyError as e:
            return e
        return None

    with Outbox.open(workspace, clock=clock, transport=InMemoryTransport()) as ob:
        for n, read_first in enumerate((False, True)):
            _device(ob)
            _delete(ob)
            assert create(ob, read_first) is None
            row = ob.store.read(["dev-1"])[1]["dev-1"]
            assert (row.version, row.deleted) == (3 + 4 * n, False)
            with ob.unit_of_work() as uow:
                uow.delete("dev-1")

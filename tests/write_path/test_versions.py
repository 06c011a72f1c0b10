"""The versions layout (issue 31, ``outbox.delta.versions``, ``outbox.delta.appends``): a save
appends the document's new version instead of rewriting the file that holds it, and conflicts
exactly where an optimistic save must; a document is its newest version, with the
highest watermark of its life's rows; the fold removes superseded versions without changing any
document; a table of the previous layout is upgraded by ``outbox migrate`` and reads the same.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from migrations.delta import ensure_table
from outbox.app.facade import Outbox
from outbox.core.errors import ConcurrencyError, SchemaMismatchError
from outbox.core.model import DocumentRow, new_incarnation
from outbox.delta import schema as S
from outbox.delta.fold import fold_table
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from outbox.testing.tables import current_rows
from tests.write_path.conftest import bare_outbox


def _raw(ob: Outbox) -> list[dict[str, Any]]:
    dt = ob.store.delta_table
    dt.update_incremental()
    cols = ["id", "version", "last_seq", "dispatched_seq"]
    return sorted(
        dt.to_pyarrow_table(columns=cols).to_pylist(), key=lambda r: (r["id"], r["version"])
    )


def _update(ob: Outbox, doc_id: str, n: int) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.get(doc_id)
        assert doc is not None
        doc.state["n"] = n
        doc.send("Changed", {"n": n}, destination="q")


def _commit_actions(ob: Outbox, version: int) -> list[dict[str, Any]]:
    entry = Path(ob.store.uri) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in entry.read_text().splitlines() if line]


def test_a_save_appends_the_new_version_and_rewrites_nothing(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        for i in range(20):
            uow.create(f"d{i}", type="T").send("Created", {}, destination="q")
    _update(ob, "d3", 1)
    version = ob.store.refresh()
    actions = _commit_actions(ob, version)
    assert [a for a in actions if "remove" in a] == []  # no file rewritten (copy-on-write)
    assert [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a] == [
        ("outbox:doc:d3", 2)  # the application transaction two saves of d3 conflict on
    ]
    assert [(r["version"], r["last_seq"]) for r in _raw(ob) if r["id"] == "d3"] == [(1, 1), (2, 2)]
    _, rows = ob.store.read(["d3"])
    assert (rows["d3"].version, rows["d3"].last_seq, rows["d3"].state) == (2, 2, {"n": 1})


def test_a_document_is_its_newest_version_with_its_lifes_highest_watermark(ob: Outbox) -> None:
    """The dispatcher's mark is a row of its own (version 0); a save had appended version 2 with
    the watermark it read (0): the document reads version 2 with watermark 1."""
    with ob.unit_of_work() as uow:
        uow.create("a", type="T").send("E", {}, destination="q")
    incarnation = current_rows(ob.store.delta_table)["a"]["incarnation"]
    _update(ob, "a", 1)
    assert ob.store.advance_watermarks({"a": 1}, {"a": incarnation}) is not None
    assert [(r["version"], r["dispatched_seq"]) for r in _raw(ob)] == [(0, 1), (1, 0), (2, 0)]
    _, rows = ob.store.read(["a"])
    assert (rows["a"].version, rows["a"].dispatched_seq, rows["a"].last_seq) == (2, 1, 2)
    assert [m.seq for m in rows["a"].pending()] == [2]
    pending = ob.store.scan_pending(columns=["id", "version", "dispatched_seq", "last_seq"])
    assert pending.to_pylist() == [{"id": "a", "version": 2, "dispatched_seq": 1, "last_seq": 2}]
    ob.store.advance_watermarks({"a": 2}, {"a": "another life"})  # a mark of another life
    assert ob.store.read(["a"])[1]["a"].dispatched_seq == 1  # counts for nothing here


def test_the_fold_removes_superseded_versions_and_changes_no_document(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        for i in range(4):
            uow.create(f"d{i}", type="T").send("E", {}, destination="q")
    incarnation = current_rows(ob.store.delta_table)["d0"]["incarnation"]
    _update(ob, "d0", 1)
    _update(ob, "d0", 2)
    ob.store.advance_watermarks({"d0": 1}, {"d0": incarnation})  # two mark rows
    ob.store.advance_watermarks({"d0": 2}, {"d0": incarnation})
    before = {k: ob.store.read([k])[1][k] for k in ("d0", "d1")}
    report = fold_table(ob.store, at=0)
    assert report.rows_removed == 4  # d0 at versions 1 and 2, and its two mark rows
    assert report.watermarks_raised == 1  # d0's newest row takes the mark
    assert [(r["id"], r["version"], r["dispatched_seq"]) for r in _raw(ob) if r["id"] == "d0"] == [
        ("d0", 3, 2)
    ]
    after = {k: ob.store.read([k])[1][k] for k in ("d0", "d1")}
    assert after == before
    assert fold_table(ob.store, at=0).rows_removed == 0


def test_a_mark_row_of_a_deleted_document_is_no_document(ob: Outbox) -> None:
    """A mark that lands after its document was deleted leaves an id with mark rows only: no
    read, sweep or create sees a document there, and the next fold removes the rows."""
    with ob.unit_of_work() as uow:
        uow.create("gone", type="T").send("E", {}, destination="q")
    incarnation = current_rows(ob.store.delta_table)["gone"]["incarnation"]
    ob.store.refresh()
    ob.store.delta_table.delete("id = 'gone'")
    ob.store.advance_watermarks({"gone": 1}, {"gone": incarnation})
    assert [r["version"] for r in _raw(ob)] == [0]
    assert ob.store.read(["gone"])[1] == {}
    assert ob.store.scan_pending().num_rows == 0
    with ob.unit_of_work() as uow:
        uow.create("gone", type="T", state={"again": True})
    assert ob.store.read(["gone"])[1]["gone"].version == 1
    assert fold_table(ob.store, at=0).rows_removed == 1
    ob.store.refresh()
    ob.store.delta_table.delete("id = 'gone'")
    ob.store.advance_watermarks({"gone": 1}, {"gone": incarnation})
    assert fold_table(ob.store, at=0).rows_removed == 1  # an id of mark rows only loses them all
    assert _raw(ob) == []


def test_the_fold_waits_for_a_fifth_of_a_bucket_to_be_superseded(workspace: Path) -> None:
    ob = bare_outbox(workspace, buckets=1)
    with ob.unit_of_work() as uow:
        for i in range(10):
            uow.create(f"d{i}", type="T")
    _update(ob, "d0", 1)  # one superseded row among 11 in its bucket at most
    assert fold_table(ob.store).rows_removed == 0
    assert fold_table(ob.store, at=0).rows_removed == 1
    ob.close()


def test_two_stale_saves_of_one_document_never_write_two_rows_of_a_version(
    workspace: Path,
) -> None:
    """Both read version 1; the first appends version 2; the second, read before it, is
    re-checked: ``ConcurrencyError``, one row per version."""
    first, second = _two_writers(workspace)
    try:
        second_row = second.read(["a"])[1]["a"]
        first_row = first.read(["a"])[1]["a"]
        first.save([DocumentWrite(_next(first_row), 1, first.version())])
        with pytest.raises(ConcurrencyError, match="was changed since it was read"):
            second.save([DocumentWrite(_next(second_row), 1, second.version() - 1)])
        versions = [
            r["version"]
            for r in first.delta_table.to_pyarrow_table(columns=["version"]).to_pylist()
        ]
        assert sorted(versions) == [1, 2]
    finally:
        first.close()
        second.close()


def _in_step(*stores: DeltaDocumentStore) -> None:
    """Make each store's next appends wait until all of them are about to append: both have
    refreshed and re-checked on the same snapshot by then."""
    barrier = threading.Barrier(len(stores))
    for store in stores:
        real = store._append_documents

        def gated(writes: Any, current: int, real: Any = real) -> None:
            barrier.wait(30)
            real(writes, current)

        store._append_documents = gated  # type: ignore[method-assign]


def _save_all(*saves: tuple[DeltaDocumentStore, DocumentWrite]) -> list[BaseException | None]:
    """Run each save on its own thread; each one's error (None: it committed)."""
    errors: list[BaseException | None] = [None] * len(saves)

    def save(n: int) -> None:
        store, write = saves[n]
        try:
            store.save([write])
        except BaseException as e:  # reported to the caller
            errors[n] = e

    threads = [threading.Thread(target=save, args=(n,)) for n in range(len(saves))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_writers_of_different_documents_in_one_bucket_commit_side_by_side(
    workspace: Path,
) -> None:
    """Two appends from the same snapshot, of different documents of the same bucket: both
    commit without a retry (their application transactions differ). In the in-place layout one
    of them always lost and retried."""
    first, second = _two_writers(workspace, buckets=1)
    _in_step(first, second)
    x = DocumentRow("x", "T", 1, {}, 0, 0, [], incarnation=new_incarnation())
    y = DocumentRow("y", "T", 1, {}, 0, 0, [], incarnation=new_incarnation())
    try:
        errors = _save_all(
            (first, DocumentWrite(x, 0, first.version())),
            (second, DocumentWrite(y, 0, second.version())),
        )
        assert errors == [None, None]
        assert (first.commit_retries, second.commit_retries) == (0, 0)
        assert set(first.read(["x", "y"])[1]) == {"x", "y"}
    finally:
        first.close()
        second.close()


def test_two_saves_of_one_document_from_one_snapshot_one_wins(workspace: Path) -> None:
    """Both re-check version 1 on the same snapshot and append version 2 at once: the
    per-document application transaction fails the later commit, whose retry re-reads and
    reports ``ConcurrencyError``. Exactly one version 2 exists."""
    first, second = _two_writers(workspace)
    try:
        rows = [first.read(["a"])[1]["a"], second.read(["a"])[1]["a"]]
        _in_step(first, second)
        errors = _save_all(
            (first, DocumentWrite(_next(rows[0]), 1, -1)),
            (second, DocumentWrite(_next(rows[1]), 1, -1)),
        )
        assert sorted(type(e).__name__ for e in errors) == ["ConcurrencyError", "NoneType"]
        assert first.commit_retries + second.commit_retries == 1
        versions = first.delta_table.to_pyarrow_table(columns=["version"])["version"].to_pylist()
        assert sorted(versions) == [1, 2]
    finally:
        first.close()
        second.close()


def test_a_save_conflicts_with_a_delete_committed_after_its_check(workspace: Path) -> None:
    """A DELETE (any commit that removes data: a Spark MERGE too) lands between a save's
    re-check and its append: the append fails, and its retry re-checks and sees the document
    gone. The delete stands."""
    first, second = _two_writers(workspace)
    try:
        row = second.read(["a"])[1]["a"]
        real = second._append_documents

        def delete_first(writes: Any, current: int) -> None:
            first.refresh()
            first.delta_table.delete("id = 'a'")
            second._append_documents = real  # type: ignore[method-assign]
            real(writes, current)

        second._append_documents = delete_first  # type: ignore[method-assign]
        with pytest.raises(ConcurrencyError, match="was changed"):
            second.save([DocumentWrite(_next(row), 1, -1)])
        assert second.commit_retries == 1
        assert DeltaDocumentStore(first.uri).read(["a"])[1] == {}
    finally:
        first.close()
        second.close()


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_a_compaction_committed_after_a_saves_check_is_no_conflict(workspace: Path) -> None:
    from outbox.delta.compaction import compact

    first, second = _two_writers(workspace, buckets=1)
    try:
        for n in range(3):
            row = DocumentRow(f"c{n}", "T", 1, {}, 0, 0, [], incarnation=new_incarnation())
            first.save([DocumentWrite(row, 0, -1)])
        row = second.read(["a"])[1]["a"]
        real = second._append_documents

        def compact_first(writes: Any, current: int) -> None:
            assert compact(first).get("numFilesRemoved")
            real(writes, current)

        second._append_documents = compact_first  # type: ignore[method-assign]
        second.save([DocumentWrite(_next(row), 1, -1)])
        assert second.commit_retries == 0
        assert second.read(["a"])[1]["a"].version == 2
    finally:
        first.close()
        second.close()


def _two_writers(
    workspace: Path, buckets: int = 4
) -> tuple[DeltaDocumentStore, DeltaDocumentStore]:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True, exist_ok=True)
    DeltaDocumentStore.create(uri, buckets=buckets)
    first = DeltaDocumentStore(uri)
    first.save(
        [DocumentWrite(DocumentRow("a", "T", 1, {}, 0, 0, [], incarnation=new_incarnation()), 0, 0)]
    )
    return first, DeltaDocumentStore(uri)


def _next(row: DocumentRow) -> DocumentRow:
    return DocumentRow(
        row.id,
        row.type,
        row.version + 1,
        {"n": 1},
        row.last_seq,
        0,
        [],
        incarnation=row.incarnation,
    )


def test_a_table_of_the_previous_layout_is_refused_until_migrated_and_then_reads_the_same(
    workspace: Path,
) -> None:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True)
    DeltaDocumentStore.create(uri, buckets=4)
    store = DeltaDocumentStore(uri)
    for i in range(3):
        row = DocumentRow(f"d{i}", "T", 1, {"i": i}, 2, 1, [], incarnation=new_incarnation())
        store.save([DocumentWrite(row, 0, store.version())])
    before = store.read(["d0", "d1", "d2"])[1]
    store.close()
    DeltaTable(uri).alter.set_table_description(S.describe_table(1, 4, "tid-1"))  # as it was
    with pytest.raises(SchemaMismatchError, match="run `outbox migrate`"):
        DeltaDocumentStore(uri)
    done = ensure_table(uri, buckets=4)
    assert done == [
        f"recorded outbox schema version 3 on {uri} (saves append a row per document version "
        "and deletes write a tombstone version from now on; the rows already there read the "
        "same; releases before it refuse the table)"
    ]
    upgraded = DeltaDocumentStore(uri)
    try:
        assert upgraded.table_id == "tid-1"
        after = upgraded.read(["d0", "d1", "d2"])[1]
        assert after == before
        assert ensure_table(uri, buckets=4) == []
    finally:
        upgraded.close()


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_an_external_writer_appending_a_version_is_read_as_the_document(ob: Outbox) -> None:
    """A Spark job (or any writer following the schema) may append the next version itself."""
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"n": 0})
    row = ob.store.read(["a"])[1]["a"]
    newer = DocumentRow("a", "T", 2, {"n": 9}, 0, 0, [], incarnation=row.incarnation)
    write_deltalake(
        ob.store.uri,
        S.table_from_rows([(newer, ob.store.bucket("a"))], extra={}).cast(
            pa.schema(ob.store.delta_table.schema().to_arrow())
        ),
        mode="append",
    )
    assert ob.store.read(["a"])[1]["a"].state == {"n": 9}

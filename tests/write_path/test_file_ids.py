"""The file id index (``outbox.delta.file_ids``) only saves reads: a document another writer
created, compacted or not, is still found by a save that creates it again, and an index that
cannot read the table steps aside. ``tests/test_mutations.py`` breaks the index so that it claims
every id absent: the first test then fails."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from outbox.core.errors import ConcurrencyError
from outbox.core.model import DocumentRow, new_incarnation
from outbox.delta.file_ids import FileIds
from outbox.delta.store import DeltaDocumentStore, DocumentWrite


def _create(store: DeltaDocumentStore, *ids: str) -> int:
    return store.save(
        [
            DocumentWrite(DocumentRow(i, "T", 1, {}, 0, 0, [], incarnation=new_incarnation()), 0, 0)
            for i in ids
        ]
    )


def _stores(workspace: Path) -> tuple[DeltaDocumentStore, DeltaDocumentStore]:
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True, exist_ok=True)
    DeltaDocumentStore.create(uri, buckets=4)
    return DeltaDocumentStore(uri), DeltaDocumentStore(uri)


def test_a_create_of_an_id_another_writer_created_fails_with_a_warm_index(
    workspace: Path,
) -> None:
    """``first`` has read every file (its index is warm); ``second`` creates ``x`` in a file
    ``first`` has not seen, then compacts so that ``x`` lives in yet another one. Each time,
    ``first``'s create of ``x`` finds it and fails; nothing of its unit of work is written."""
    first, second = _stores(workspace)
    try:
        _create(first, *[f"d{i}" for i in range(40)])
        first.read(["x", "d1"])
        index = first._file_ids
        assert index.files_read + index.files_noted > 0  # the index is in use, and warm
        _create(second, "x")
        with pytest.raises(ConcurrencyError):
            _create(first, "x", "fresh-1")
        DeltaTable(first.uri).optimize.compact()
        with pytest.raises(ConcurrencyError):
            _create(first, "fresh-2", "x")
        _, rows = first.read(["x", "fresh-1", "fresh-2"])
        assert sorted(rows) == ["x"]
        assert rows["x"].version == 1
    finally:
        first.close()
        second.close()


def test_the_index_reads_each_file_once_and_answers_for_the_ids_it_may_hold(
    workspace: Path,
) -> None:
    first, second = _stores(workspace)
    try:
        _create(first, "a", "b", "c")
        index = first._file_ids
        assert index.maybe_present(first._dt, ["a", "zz", "c"], first.bucket) == ["a", "c"]
        read = index.files_read
        assert index.maybe_present(first._dt, ["zz", "b"], first.bucket) == ["b"]
        assert index.files_read == read  # nothing new in the table: no file read again
        _create(second, "zz")
        first.read([])  # refresh the snapshot
        assert index.maybe_present(first._dt, ["zz"], first.bucket) == ["zz"]
        assert index.files_read == read + 1
    finally:
        first.close()
        second.close()


def test_an_index_that_cannot_read_the_table_steps_aside(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table the index cannot read (a path it cannot open, a reader feature pyarrow lacks):
    the SQL read decides, and a create of an existing id still fails."""
    first, second = _stores(workspace)
    try:
        _create(second, "x")

        def broken(self: object, dt: object, paths: list[str]) -> None:
            raise ValueError("cannot open")

        monkeypatch.setattr(type(first._file_ids), "_read", broken)
        with pytest.raises(ConcurrencyError):
            _create(first, "x")
        assert first._file_ids.disabled == "ValueError: cannot open"
        _create(first, "y")
        assert sorted(first.read(["x", "y"])[1]) == ["x", "y"]
    finally:
        first.close()
        second.close()


def test_an_index_past_its_size_steps_aside_and_every_id_is_still_found(workspace: Path) -> None:
    first, second = _stores(workspace)
    try:
        first._file_ids._max_ids = 5
        _create(second, *[f"s{i}" for i in range(8)])
        _create(first, *[f"f{i}" for i in range(8)])
        with pytest.raises(ConcurrencyError):
            _create(first, "s3")
        with pytest.raises(ConcurrencyError):
            _create(first, "f7")
        assert first._file_ids.disabled == "the table holds more than 5 ids"
    finally:
        first.close()
        second.close()


# --- the index on its own, over files the tests write (what a foreign writer can leave) -------


class _Column:
    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def to_pylist(self) -> list[Any]:
        return self.values


class _Snapshot:
    """What ``FileIds`` reads of a deltalake snapshot: the add actions, the configuration, the
    version and the table's root."""

    def __init__(self, root: Path, files: dict[str, int], config: dict[str, str] | None = None):
        self.table_uri = str(root)
        self.files = files
        self.config = config or {}

    def get_add_actions(self, flatten: bool = False) -> Any:
        paths, parts = list(self.files), [{"bucket": b} for b in self.files.values()]
        return SimpleNamespace(column=lambda n: _Column(paths if n == "path" else parts))

    def metadata(self) -> Any:
        return SimpleNamespace(configuration=self.config)

    def version(self) -> int:
        return 1


def _file(root: Path, name: str, ids: pa.Array) -> str:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids}), root / name)
    return name


def _in_bucket_0(_id: str) -> int:
    return 0


def test_an_empty_data_file_holds_nothing_and_breaks_nothing(tmp_path: Path) -> None:
    """A writer can leave a file with no rows (or only null ids): it answered with an
    ``IndexError`` on every read of its bucket before."""
    empty = _file(tmp_path, "bucket=0/empty.parquet", pa.array([], pa.string()))
    nulls = _file(tmp_path, "bucket=0/nulls.parquet", pa.array([None], pa.string()))
    full = _file(tmp_path, "bucket=0/full.parquet", pa.array(["a", "b"]))
    snap = _Snapshot(tmp_path, {empty: 0, nulls: 0, full: 0})
    index = FileIds()
    assert index.maybe_present(snap, ["b", "zz", "a"], _in_bucket_0) == ["b", "a"]
    assert index.disabled is None


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("binary id", "the id column of bucket=0/x.parquet is binary, not a string"),
        ("absolute path", "a data file outside the table's folder (s3://b/t/x.parquet)"),
        ("column mapping", "column mapping (name)"),
    ],
)
def test_a_file_the_index_cannot_answer_for_makes_it_step_aside(
    tmp_path: Path, case: str, why: str
) -> None:
    """A binary ``id`` would never match a string (a create of an existing id would skip SQL),
    a shallow clone's absolute path panics in deltalake's filesystem, and under column mapping
    the file's ``id`` may be another column: each turns the index off, for SQL to answer."""
    ids = pa.array([b"a"], pa.binary()) if case == "binary id" else pa.array(["a"])
    name = _file(tmp_path, "bucket=0/x.parquet", ids)
    if case == "absolute path":
        name = "s3://b/t/x.parquet"
    config = {"delta.columnMapping.mode": "name"} if case == "column mapping" else {}
    index = FileIds()
    assert index.maybe_present(_Snapshot(tmp_path, {name: 0}, config), ["a"], _in_bucket_0) is None
    assert index.disabled == f"_Unreadable: {why}"
    assert index.maybe_present(_Snapshot(tmp_path, {}), ["a"], _in_bucket_0) is None  # stays off


def test_a_file_the_store_did_not_serve_this_time_leaves_the_index_on(tmp_path: Path) -> None:
    """An object store's 503 or a timeout is an ``OSError``: that read goes to SQL, and the
    index answers again once the file can be read."""
    snap = _Snapshot(tmp_path, {"bucket=0/later.parquet": 0})
    index = FileIds()
    assert index.maybe_present(snap, ["a"], _in_bucket_0) is None  # the file is not there yet
    assert index.disabled is None
    _file(tmp_path, "bucket=0/later.parquet", pa.array(["a"]))
    assert index.maybe_present(snap, ["a", "b"], _in_bucket_0) == ["a"]


def test_the_stores_own_appends_are_noted_not_read_back_and_still_found(
    workspace: Path,
) -> None:
    """A save's re-check answered at the version its append builds on, so the append's new files
    are noted with the ids it wrote (no read back: 30-40 ms a commit, as much as the append).
    The noted ids still count: creating one of them again fails, also after a watermark append
    (noted the same way) and with the SQL read as the only witness."""
    first, other = _stores(workspace)
    try:
        _create(first, "a", "b")  # the first re-check reads whatever the table has
        read = first._file_ids.files_read
        _create(first, "c")
        _create(first, "d", "e")
        first.advance_watermarks({"a": 0})
        assert first._file_ids.files_noted >= 3
        assert first._file_ids.files_read == read  # its own files were never read back
        for again in ("a", "c", "e"):
            with pytest.raises(ConcurrencyError):
                _create(first, again, f"fresh-{again}")
        _create(other, "x")  # another writer's file: read, not noted
        with pytest.raises(ConcurrencyError):
            _create(first, "x")
        assert first._file_ids.files_read > read
        _, rows = first.read(["a", "c", "e", "x", "fresh-a", "fresh-c", "fresh-e"])
        assert sorted(rows) == ["a", "c", "e", "x"]
    finally:
        first.close()
        other.close()


def test_nothing_is_noted_when_another_commit_came_between(workspace: Path) -> None:
    """The new files are certainly the append's only at ``before + 1``: here another writer's
    commit lands between the snapshot the index answered at and the append, so the append
    commits two versions on and nothing is noted (the next answer reads both files)."""
    from outbox.delta import appends

    first, other = _stores(workspace)
    try:
        _create(first, "a")
        index = first._file_ids
        noted = index.files_noted
        before = int(first._dt.version())
        assert index.maybe_present(first._dt, ["q"], first.bucket) == []  # answered at before
        _create(other, "y")
        row = DocumentRow("z", "T", 1, {}, 0, 0, [], incarnation=new_incarnation())
        appends.append(
            first._dt,
            appends.document_rows([DocumentWrite(row, 0, 0)], first.bucket),
            operation="save",
        )
        assert int(first._dt.version()) == before + 2
        index.wrote(first._dt, ["z"], first.bucket, before)
        assert index.files_noted == noted
        assert index.maybe_present(first._dt, ["y", "z", "q"], first.bucket) == ["y", "z"]
    finally:
        first.close()
        other.close()

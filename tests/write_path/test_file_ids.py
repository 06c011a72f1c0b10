"""The file id index (``outbox.delta.file_ids``) only saves reads: a document another writer
created, compacted or not, is still found by a save that creates it again, and an index that
cannot read the table steps aside. ``tests/test_mutations.py`` breaks the index so that it claims
every id absent: the first test then fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from outbox.core.errors import ConcurrencyError
from outbox.core.model import DocumentRow, new_incarnation
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
        assert first._file_ids.files_read > 0  # the index is in use, and warm
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
            raise OSError("cannot open")

        monkeypatch.setattr(type(first._file_ids), "_read", broken)
        with pytest.raises(ConcurrencyError):
            _create(first, "x")
        assert first._file_ids.disabled == "OSError: cannot open"
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

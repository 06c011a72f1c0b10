"""The document-store contract: what a save, a read and a watermark mean, on any storage.

Why it ships: the same Delta table may live on a local disk, on Azure or on S3, and every rule the
rest of the product builds on (all-or-nothing saves, one winner between two writers of a document,
a watermark that only rises and only for its life) must hold on each. A backend subclasses
``DocumentStoreContract`` and implements ``table_uri`` (a fresh, empty location for one test) and,
when it needs them, ``storage_options``; the suite creates the table there and opens as many
stores on it as a test needs (two stores are two writer processes as far as Delta can tell).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from outbox.core.errors import ClosedError, ConcurrencyError
from outbox.core.model import DocumentRow, OutboxMessage, new_incarnation
from outbox.delta.group_commit import DocumentWrite
from outbox.delta.ports import DocumentStore
from outbox.delta.store import DeltaDocumentStore


def _row(doc_id: str, version: int, last_seq: int, *, life: str, state: Any = None) -> DocumentRow:
    msgs = [
        OutboxMessage(seq=s, message_id=f"{doc_id}-{s}", destination="q", type="E", body="{}")
        for s in range(1, last_seq + 1)
    ]
    return DocumentRow(
        doc_id, "T", version, state or {"v": version}, last_seq, 0, msgs, incarnation=life
    )


class DocumentStoreContract:
    """Subclass as ``Test<YourStorage>``; override ``table_uri``."""

    def table_uri(self) -> str:
        """A fresh location for this test's table (called after the subclass's fixtures)."""
        raise NotImplementedError

    def storage_options(self) -> dict[str, str]:
        return {}

    def open_store(self, uri: str) -> DocumentStore:
        return DeltaDocumentStore(uri, storage_options=self.storage_options())

    @pytest.fixture
    def stores(self) -> Iterator[list[DocumentStore]]:
        """Two stores on one new table (as two processes would open it)."""
        uri = self.table_uri()
        DeltaDocumentStore.create(uri, buckets=4, storage_options=self.storage_options())
        opened = [self.open_store(uri), self.open_store(uri)]
        yield opened
        for s in opened:
            s.close()

    # --- saves and reads ------------------------------------------------------------------

    def test_a_save_reads_back_in_another_store(self, stores: list[DocumentStore]) -> None:
        a, b = stores
        life = new_incarnation()
        version = a.save([DocumentWrite(_row("d1", 1, 2, life=life), 0, -1)])
        assert version > 0
        _, rows = b.read(["d1", "missing"])
        assert set(rows) == {"d1"}
        got = rows["d1"]
        assert (got.version, got.last_seq, got.dispatched_seq, got.incarnation) == (1, 2, 0, life)
        assert [m.seq for m in got.outbox] == [1, 2]

    def test_several_documents_are_one_commit(self, stores: list[DocumentStore]) -> None:
        a, _ = stores
        before = a.version()
        writes = [
            DocumentWrite(_row(f"m{i}", 1, 1, life=new_incarnation()), 0, -1) for i in range(5)
        ]
        after = a.save(writes)
        assert after == before + 1
        assert len(a.read([f"m{i}" for i in range(5)])[1]) == 5

    def test_a_stale_save_raises_and_writes_nothing(self, stores: list[DocumentStore]) -> None:
        a, b = stores
        life = new_incarnation()
        a.save([DocumentWrite(_row("s", 1, 1, life=life), 0, -1)])
        read_at, rows = b.read(["s"])
        a.save([DocumentWrite(_row("s", 2, 1, life=life, state={"by": "a"}), 1, -1)])
        stale = _row("s", 2, 1, life=life, state={"by": "b"})
        with pytest.raises(ConcurrencyError):
            b.save([DocumentWrite(stale, rows["s"].version, read_at)])
        assert b.read(["s"])[1]["s"].state == {"by": "a"}

    def test_an_existing_id_cannot_be_created_again(self, stores: list[DocumentStore]) -> None:
        a, b = stores
        a.save([DocumentWrite(_row("c", 1, 0, life=new_incarnation()), 0, -1)])
        with pytest.raises(ConcurrencyError, match="already exists"):
            b.save([DocumentWrite(_row("c", 1, 0, life=new_incarnation()), 0, -1)])

    def test_one_of_two_concurrent_saves_of_a_document_wins(
        self, stores: list[DocumentStore]
    ) -> None:
        a, b = stores
        life = new_incarnation()
        a.save([DocumentWrite(_row("r", 1, 0, life=life), 0, -1)])
        reads = [s.read(["r"]) for s in stores]
        errors: list[BaseException | None] = [None, None]

        def save(n: int) -> None:
            at, rows = reads[n]
            row = _row("r", 2, 0, life=life, state={"by": n})
            try:
                stores[n].save([DocumentWrite(row, rows["r"].version, at)])
            except BaseException as e:  # reported below
                errors[n] = e

        threads = [threading.Thread(target=save, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(type(e).__name__ for e in errors) == ["ConcurrencyError", "NoneType"]
        winner = errors.index(None)
        assert b.read(["r"])[1]["r"].state == {"by": winner}

    def test_saves_of_different_documents_from_two_stores_both_commit(
        self, stores: list[DocumentStore]
    ) -> None:
        errors: list[BaseException] = []

        def save(n: int) -> None:
            try:
                stores[n].save([DocumentWrite(_row(f"x{n}", 1, 1, life=new_incarnation()), 0, -1)])
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=save, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert set(stores[0].read(["x0", "x1"])[1]) == {"x0", "x1"}

    def test_a_foreign_delete_between_check_and_commit_fails_the_save(
        self, stores: list[DocumentStore]
    ) -> None:
        """Another writer (any Delta client: here raw deltalake) deletes the document after the
        save checked it and before it commits: the save's append fails, its retry re-checks and
        reports ``ConcurrencyError``, and the delete stands."""
        from deltalake import DeltaTable

        a, b = stores
        life = new_incarnation()
        a.save([DocumentWrite(_row("f", 1, 1, life=life), 0, -1)])
        _, rows = b.read(["f"])
        assert isinstance(b, DeltaDocumentStore)
        real = b._append_documents

        def foreign_delete_first(writes: Any, current: int) -> None:
            DeltaTable(b.uri, storage_options=self.storage_options() or None).delete("id = 'f'")
            b._append_documents = real  # type: ignore[method-assign]
            real(writes, current)

        b._append_documents = foreign_delete_first  # type: ignore[method-assign]
        with pytest.raises(ConcurrencyError):
            b.save([DocumentWrite(_row("f", 2, 1, life=life), rows["f"].version, -1)])
        assert a.read(["f"])[1] == {}

    # --- watermarks -----------------------------------------------------------------------

    def test_a_watermark_rises_never_falls_and_counts_for_its_life(
        self, stores: list[DocumentStore]
    ) -> None:
        a, b = stores
        life = new_incarnation()
        a.save([DocumentWrite(_row("w", 1, 3, life=life), 0, -1)])
        assert b.advance_watermarks({"w": 2}, {"w": life}) is not None
        b.advance_watermarks({"w": 1}, {"w": life})
        b.advance_watermarks({"w": 3}, {"w": new_incarnation()})  # another life's mark
        got = a.read(["w"])[1]["w"]
        assert got.dispatched_seq == 2
        assert [m.seq for m in got.pending()] == [3]

    def test_scan_pending_lists_exactly_the_documents_with_unsent_messages(
        self, stores: list[DocumentStore]
    ) -> None:
        a, _ = stores
        lives = {d: new_incarnation() for d in ("p1", "p2", "done")}
        a.save([DocumentWrite(_row(d, 1, 2, life=lives[d]), 0, -1) for d in lives])
        a.advance_watermarks({"done": 2, "p2": 1}, {"done": lives["done"], "p2": lives["p2"]})
        pending = a.scan_pending(["id", "last_seq", "dispatched_seq"]).to_pylist()
        assert sorted((r["id"], r["last_seq"], r["dispatched_seq"]) for r in pending) == [
            ("p1", 2, 0),
            ("p2", 2, 1),
        ]

    def test_a_save_never_brings_a_sent_message_back(self, stores: list[DocumentStore]) -> None:
        """The dispatcher marked seq 2 after the save read the document: the save keeps only
        seq 3, whatever outbox it carried."""
        a, b = stores
        life = new_incarnation()
        a.save([DocumentWrite(_row("n", 1, 2, life=life), 0, -1)])
        at, rows = b.read(["n"])
        a.advance_watermarks({"n": 2}, {"n": life})
        row = _row("n", 2, 3, life=life)
        b.save([DocumentWrite(row, rows["n"].version, at)])
        got = a.read(["n"])[1]["n"]
        assert (got.version, got.dispatched_seq) == (2, 2)
        assert [m.seq for m in got.pending()] == [3]

    def test_a_closed_store_refuses_work(self, stores: list[DocumentStore]) -> None:
        a, _ = stores
        a.close()
        with pytest.raises(ClosedError):
            a.read(["anything"])

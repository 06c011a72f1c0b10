"""A document table for rescue scenarios: save, dispatch and delete with one call each.

Why in the kit: the rescuer-engine contract builds its change feeds with it, and a third party's
engine tests need the same scenarios. Delta commit timestamps are real wall time, so a test sets
its ``ManualClock`` relative to them (``at(version, +delay)``) instead of sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from outbox.core.model import DocumentRow
from outbox.delta.store import DeltaDocumentStore, DocumentWrite
from outbox.delta.versions import latest_rows


def current_rows(delta_table: Any, columns: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every document of a ``deltalake.DeltaTable`` as it reads now: its latest version, with the
    folded watermark (``outbox.delta.versions``), by id. For tests and tools that look at the
    table directly: its raw rows hold one row per document *version*."""
    delta_table.update_incremental()
    wanted = None if columns is None else list(dict.fromkeys([*columns, *_FOLD_COLUMNS]))
    table = latest_rows(delta_table.to_pyarrow_table(columns=wanted))
    rows = table.to_pylist()
    if columns is not None:
        rows = [{c: r[c] for c in columns} for r in rows]
    return {
        str(r["id"]) if "id" in r else str(i): r
        for i, r in zip(table["id"].to_pylist(), rows, strict=True)
    }


_FOLD_COLUMNS = ["id", "version", "dispatched_seq", "incarnation"]


class Table:
    """A document table plus the helpers a rescue scenario needs."""

    def __init__(self, path: Path, *, buckets: int = 4) -> None:
        self.uri = str(path)
        DeltaDocumentStore.create(self.uri, buckets=buckets)
        self.store = DeltaDocumentStore(self.uri)
        self._versions: dict[str, int] = {}

    def put(self, *docs: tuple[str, int], life: str | None = None) -> int:
        """Save documents with ``last_seq`` (new ones inserted, others updated) in one commit;
        ``life``: the incarnation of the documents (None, as rows written before incarnations)."""
        writes = []
        read_at = self.store.refresh()
        for doc_id, last_seq in docs:
            have = self._versions.get(doc_id, 0)
            row = DocumentRow(doc_id, "t", have + 1, {}, last_seq, 0, [], incarnation=life)
            writes.append(DocumentWrite(row, have, read_at))
        version = self.store.save(writes)
        for doc_id, _ in docs:
            self._versions[doc_id] = self._versions.get(doc_id, 0) + 1
        return version

    def mark(self, doc_id: str, seq: int, life: str | None) -> int:
        """A watermark for the document's life ``life``, as the dispatcher writes it once the
        messages sent from that life were accepted (maybe after the life ended)."""
        version = self.store.advance_watermarks({doc_id: seq}, {doc_id: life})
        assert version is not None
        return version

    def dispatch(self, **marks: int) -> int:
        """Advance the watermarks (``id=seq``) as the dispatcher does (a mark row each, of the
        document's life now); returns the version."""
        version = self.store.advance_watermarks(marks)
        assert version is not None
        return version

    def fold(self) -> int:
        """Fold every superseded version and mark row away (``outbox.delta.fold``); returns the
        version."""
        from outbox.delta.fold import fold_table

        fold_table(self.store, at=0)
        return self.store.refresh()

    def rewrite_buckets(self) -> int:
        """Replace every bucket with the rows it holds, one commit each (a delete and an insert
        of each row in one commit: what ``outbox maintain --repair`` does to a damaged bucket)."""
        from deltalake import write_deltalake

        self.store.refresh()
        for b in sorted(set(self.store._query("SELECT bucket FROM t")["bucket"].to_pylist())):
            rows = self.store._query(f"SELECT * FROM t WHERE bucket = {int(b)}")
            schema = pa.schema(self.store.delta_table.schema().to_arrow())
            write_deltalake(
                self.store.delta_table,
                rows.select(schema.names).cast(schema),
                mode="overwrite",
                predicate=f"bucket = {int(b)}",
            )
            self.store.refresh()
        return self.store.refresh()

    def delete(self, doc_id: str) -> int:
        self.store.refresh()
        self.store.delta_table.delete(f"id = '{doc_id}'")
        self._versions.pop(doc_id, None)
        return self.store.refresh()

    def committed_at(self, version: int) -> datetime:
        for entry in self.store.delta_table.history(self.store.version() - version + 1):
            if int(entry["version"]) == version:
                return datetime.fromtimestamp(int(entry["timestamp"]) / 1000, tz=UTC)
        raise AssertionError(f"no commit {version}")

    def at(self, version: int, offset: float) -> datetime:
        """Commit time of ``version`` plus ``offset`` seconds."""
        return self.committed_at(version) + timedelta(seconds=offset)

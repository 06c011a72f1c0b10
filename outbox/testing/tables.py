"""A document table for rescue scenarios: save, dispatch and delete with one call each.

Why in the kit: the rescuer-engine contract builds its change feeds with it, and a third party's
engine tests need the same scenarios. Delta commit timestamps are real wall time, so a test sets
its ``ManualClock`` relative to them (``at(version, +delay)``) instead of sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from outbox.core.model import DocumentRow
from outbox.delta.store import DeltaDocumentStore, DocumentWrite


class Table:
    """A document table plus the helpers a rescue scenario needs."""

    def __init__(self, path: Path, *, buckets: int = 4) -> None:
        self.uri = str(path)
        DeltaDocumentStore.create(self.uri, buckets=buckets)
        self.store = DeltaDocumentStore(self.uri)
        self._versions: dict[str, int] = {}

    def put(self, *docs: tuple[str, int]) -> int:
        """Save documents with ``last_seq`` (new ones inserted, others updated) in one commit."""
        writes = []
        read_at = self.store.refresh()
        for doc_id, last_seq in docs:
            have = self._versions.get(doc_id, 0)
            row = DocumentRow(doc_id, "t", have + 1, {}, last_seq, 0, [])
            writes.append(DocumentWrite(row, have, read_at))
        version = self.store.save(writes)
        for doc_id, _ in docs:
            self._versions[doc_id] = self._versions.get(doc_id, 0) + 1
        return version

    def dispatch(self, **marks: int) -> int:
        """Advance the watermarks (``id=seq``) as the dispatcher does; returns the version."""
        version = self.store.advance_watermarks(marks)
        assert version is not None
        return version

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

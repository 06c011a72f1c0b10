"""What a store's reads found at one table version, so a save built on them needs no re-check.

Why: a unit of work reads its documents, then saves; when the table has not moved in between,
the snapshot the append commits against is the one the read checked, and a second read of the
same ids would only repeat it (``DeltaDocumentStore.save``). The store keeps this under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox.core.model import DocumentRow

if TYPE_CHECKING:
    from outbox.delta.group_commit import DocumentWrite

#: Documents remembered at the current table version.
MAX_REMEMBERED = 100_000


class SeenReads:
    """id -> (version, incarnation) as read at one table version (0: a missing document)."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._limit = limit
        self._at = -1
        self._seen: dict[str, tuple[int, str | None]] = {}

    def remember(self, version: int, ids: Sequence[str], rows: list[DocumentRow]) -> None:
        """Keep what a read of ``ids`` found at ``version`` (``rows``: the ones that exist)."""
        if self._at != version:
            self._at, self._seen = version, {}
        seen = self._seen
        if len(seen) + len(ids) > self._limit:
            seen.clear()
        seen.update(dict.fromkeys(ids, (0, None)))
        seen.update({r.id: (r.version, r.incarnation) for r in rows if r.id in seen})

    def covers(self, writes: Sequence[DocumentWrite], current: int) -> bool:
        """Were all written documents read at ``current``, as each write expects them?"""
        if self._at != current:
            return False
        for w in writes:
            found = self._seen.get(w.row.id)
            if found is None or found[0] != w.expected_version:
                return False
            if w.expected_version and found[1] != w.row.incarnation:
                return False
        return True

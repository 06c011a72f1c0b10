"""The trace's index: which commits touched which documents, in the workspace's database
(``outbox_commit_index``, migration 0012; issue 46, item 1).

Why: a document's history from the change data feed costs a read of every retained commit file
(1.6 s at 10,000 commits, however narrow the predicate), and the trace of one document needs a
few of them. The index names those few; ``changes.document_rows`` reads them.

Built from the table itself, so every writer is in it (the embedded one, Spark jobs, foreign
writers, the fold): each new commit's change files are read for their ids (``changes``, the
same files the feed would read) and a row (table, document, version) written per id. The
trace catches it up before it looks (``catch_up``): what the writers committed since the last
trace costs one read of those commits' ids, once, for everyone (the cursor is shared). Commits
below the oldest retained one are pruned as it goes: the index never names a version the log no
longer has. A derived cache: deleting its rows costs only a rebuild. An erased document's rows
are deleted with its other rows (``erasure_sql.purge``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from migrations.sql.tables import commit_index as T
from migrations.sql.tables import commit_index_cursor as C
from outbox.app.trace.changes import Commits
from outbox.delta import change_files

log = logging.getLogger("outbox.trace")

#: Commits read and written per transaction while catching up (the cursor moves after each).
CHUNK = 500


class CommitIndex:
    """The index of one table (``table_id``) in ``db``, a ``dispatcher.queue.database.Database``."""

    def __init__(self, db: Any, table_id: str) -> None:
        self._db = db
        self._table_id = table_id

    def indexed_to(self) -> int | None:
        """The newest version every commit up to which is indexed (None: never built)."""
        with self._db.read("read the commit index's cursor") as conn:
            q = select(C.c.indexed_to).where(C.c.table_id == self._table_id)
            value = conn.execute(q).scalar()
        return None if value is None else int(value)

    def catch_up(
        self,
        commits: Commits,
        oldest: int,
        latest: int,
        now: datetime,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Index every commit from the cursor (or ``oldest``) to ``latest``; prune what is below
        ``oldest``. Returns how many commits were read. ``progress(done, total)`` after each
        chunk."""
        cursor = self.indexed_to()
        start = oldest if cursor is None else max(oldest, cursor + 1)
        total = max(0, latest - start + 1)
        for lo in range(start, latest + 1, CHUNK):
            hi = min(latest, lo + CHUNK - 1)
            versions = list(range(lo, hi + 1))
            pairs = _ids_of(commits, versions)
            self._write(pairs, hi, oldest, now)
            if progress is not None:
                progress(hi - start + 1, total)
        if total == 0 and cursor is not None:
            self._prune(oldest)
        return total

    def clear(self) -> None:
        """Forget the table's index: the next ``catch_up`` rebuilds it from the oldest commit."""
        with self._db.write("clear the commit index") as conn:
            conn.execute(delete(T).where(T.c.table_id == self._table_id))
            conn.execute(delete(C).where(C.c.table_id == self._table_id))

    def versions(self, doc_id: str, first: int, latest: int) -> list[int]:
        """The versions from ``first`` to ``latest`` the document changed in, oldest first."""
        q = (
            select(T.c.table_version)
            .where(
                T.c.table_id == self._table_id,
                T.c.document_id == doc_id,
                T.c.table_version.between(first, latest),
            )
            .order_by(T.c.table_version)
        )
        with self._db.read("read the commit index") as conn:
            return [int(v) for v in conn.execute(q).scalars()]

    def _write(self, pairs: set[tuple[str, int]], upto: int, oldest: int, now: datetime) -> None:
        dialect = postgresql if self._db.postgres else sqlite
        rows = [
            {"table_id": self._table_id, "document_id": d, "table_version": v} for d, v in pairs
        ]
        with self._db.write("write the commit index") as conn:
            if rows:
                stmt = dialect.insert(T).on_conflict_do_nothing(
                    index_elements=["table_id", "document_id", "table_version"]
                )
                conn.execute(stmt, rows)
            moved = conn.execute(
                update(C)
                .where(C.c.table_id == self._table_id, C.c.indexed_to < upto)
                .values(indexed_to=upto, updated_at=now)
            ).rowcount
            if not moved:
                first = {"table_id": self._table_id, "indexed_to": upto, "updated_at": now}
                conn.execute(
                    dialect.insert(C).on_conflict_do_nothing(index_elements=["table_id"]), [first]
                )
            self._prune_in(conn, oldest)

    def _prune(self, oldest: int) -> None:
        with self._db.write("prune the commit index") as conn:
            self._prune_in(conn, oldest)

    def _prune_in(self, conn: Any, oldest: int) -> None:
        conn.execute(delete(T).where(T.c.table_id == self._table_id, T.c.table_version < oldest))


def _ids_of(commits: Commits, versions: list[int]) -> set[tuple[str, int]]:
    """(document id, version) for every row each commit's change files hold (``Commits.map``:
    in parallel on an object store)."""
    commits.load(versions)
    jobs = [
        (v, path) for v in versions for path, _, _ in change_files.changed_files(commits.actions(v))
    ]

    def ids(job: tuple[int, str]) -> list[tuple[str, int]]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        v, path = job
        with commits.fs.open_input_file(path) as f:
            column = pq.ParquetFile(f).read(columns=["id"])["id"]
        return [(str(i), v) for i in pc.unique(column.combine_chunks()).to_pylist()]

    return {pair for part in commits.map(ids, jobs) for pair in part}

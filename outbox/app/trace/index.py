"""The trace's index: what each commit did to each document, in the workspace's database
(``outbox_commit_index`` and ``outbox_commit_index_messages``, migrations 0012 and 0013; issue
46, item 1).

Why: a document's history from the change data feed costs a read of every retained commit file
(1.6 s at 10,000 commits, however narrow the predicate); reading only the document's commits
still costs a Parquet file per commit (pyarrow's cost per file: most of the trace). So the
index keeps what a trace shows of each change row (its change type, the document's version and
sequence numbers, the ids of the messages it carries) and each message once per document (what
its fate needs), and a trace reads no data file. Messages are also found here by their id or
correlation id, without a scan of the feed.

Built from the table itself, so every writer is in it (the embedded one, Spark jobs, foreign
writers, the fold): each new commit's change files are read (``changes.change_rows``, the rows
the feed would give) and their rows written, pre-images left out. The trace catches it up before
it looks (``catch_up``): what the writers committed since the last trace costs one read of
those commits, once, for everyone (the cursor is shared). Rows below the oldest retained commit
are pruned as it goes (a message when the newest commit carrying it is), so the index never
names a version the log no longer has. A derived cache: deleting its rows costs only a rebuild.
An erased document's rows are deleted with its other rows (``erasure_sql.purge``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from migrations.sql.tables import commit_index as T
from migrations.sql.tables import commit_index_cursor as C
from migrations.sql.tables import commit_index_messages as M
from outbox.app.trace.changes import Commits, change_rows

log = logging.getLogger("outbox.trace")

#: Commits read and written per transaction while catching up (the cursor moves after each).
CHUNK = 500
#: What a message's fate needs, as the table's ``outbox`` structs name it.
_FIELDS = ("message_id", "seq", "destination", "type", "ordering_key", "correlation_id")


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
            rows, messages = _entries(self._table_id, change_rows(commits, list(range(lo, hi + 1))))
            self._write(rows, messages, hi, oldest, now)
            if progress is not None:
                progress(hi - start + 1, total)
        if total == 0 and cursor is not None:
            self._prune(oldest)
        return total

    def clear(self) -> None:
        """Forget the table's index: the next ``catch_up`` rebuilds it from the oldest commit."""
        with self._db.write("clear the commit index") as conn:
            for table in (T, M, C):
                conn.execute(delete(table).where(table.c.table_id == self._table_id))

    def rows(self, doc_id: str, first: int, latest: int) -> list[dict[str, Any]]:
        """The document's change rows from ``first`` to ``latest`` as the feed names their
        columns (``_change_type``, ``_commit_version``, ``version``, ``last_seq``,
        ``dispatched_seq``), oldest first; ``outbox``: the messages the row carries (those of
        rows that show them), each with the fields of its fate and its ``session_id``."""
        where = (T.c.table_id == self._table_id) & (T.c.document_id == doc_id)
        q = (
            select(T)
            .where(where, T.c.table_version.between(first, latest))
            .order_by(T.c.table_version, T.c.row_no)
        )
        m = select(M).where(M.c.table_id == self._table_id, M.c.document_id == doc_id)
        with self._db.read("read the commit index") as conn:
            found = conn.execute(q).mappings().all()
            messages = {r["message_id"]: dict(r) for r in conn.execute(m).mappings()}
        return [
            {
                "_change_type": r["change"],
                "_commit_version": int(r["table_version"]),
                "version": int(r["document_version"]),
                "last_seq": int(r["last_seq"]),
                "dispatched_seq": int(r["dispatched_seq"]),
                "outbox": [messages[i] for i in json.loads(r["messages"] or "[]") if i in messages],
            }
            for r in found
        ]

    def find(self, value: str, first: int) -> dict[str, set[str]]:
        """key (``message_id``, ``correlation_id``) -> the documents whose messages carried by
        a commit from ``first`` on have that key = ``value``."""
        q = select(M.c.document_id, M.c.message_id == value).where(
            M.c.table_id == self._table_id,
            or_(M.c.message_id == value, M.c.correlation_id == value),
            M.c.last_version >= first,
        )
        out: dict[str, set[str]] = {}
        with self._db.read("search the commit index") as conn:
            for doc_id, by_message in conn.execute(q).all():
                out.setdefault("message_id" if by_message else "correlation_id", set()).add(doc_id)
        return out

    def _write(
        self,
        rows: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        upto: int,
        oldest: int,
        now: datetime,
    ) -> None:
        dialect: Any = postgresql if self._db.postgres else sqlite
        with self._db.write("write the commit index") as conn:
            if rows:
                keys = ["table_id", "document_id", "table_version", "row_no"]
                conn.execute(dialect.insert(T).on_conflict_do_nothing(index_elements=keys), rows)
            if messages:
                stmt = dialect.insert(M)
                keys = ["table_id", "document_id", "message_id"]
                newer = {"last_version": stmt.excluded.last_version}
                conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=newer), messages)
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
        conn.execute(delete(M).where(M.c.table_id == self._table_id, M.c.last_version < oldest))


def _entries(
    table_id: str, tables: list[pa.Table]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(index rows, message rows) of commits' change rows (``change_rows``), oldest commit
    first. A row shows the messages it carries unless it is a delete or a mark (as the trace
    reads them); each message is kept once per document, with the newest commit carrying it."""
    from outbox.core.clock import utc

    rows: list[dict[str, Any]] = []
    messages: dict[tuple[str, str], dict[str, Any]] = {}
    numbers: dict[tuple[str, int], int] = {}
    for read in tables:
        t = read.filter(pc.not_equal(read["_change_type"], "update_preimage"))
        if not t.num_rows:
            continue
        ids = t["id"].to_pylist()
        at_version = t["_commit_version"].to_pylist()
        carried: list[list[str]] = [[] for _ in ids]
        if "outbox" in t.column_names:
            column = t["outbox"].combine_chunks()
            flat = pc.list_flatten(column)
            names = {f.name for f in flat.type}
            parents = pc.list_parent_indices(column).to_pylist()
            values: dict[str, list[Any]] = {
                f: flat.field(f).to_pylist() if f in names else [None] * len(flat)
                for f in (*_FIELDS, "created_at")
            }
            for k, parent in enumerate(parents):
                doc_id, message_id = str(ids[parent]), str(values["message_id"][k])
                carried[parent].append(message_id)
                at = values["created_at"][k]
                messages[(doc_id, message_id)] = {
                    "table_id": table_id,
                    "document_id": doc_id,
                    "message_id": message_id,
                    "seq": int(values["seq"][k]),
                    "destination": str(values["destination"][k]),
                    "type": str(values["type"][k]),
                    "session_id": str(values["ordering_key"][k] or doc_id),  # dispatcher.keys
                    "correlation_id": values["correlation_id"][k],
                    "created_at": None if at is None else utc(at),
                    "last_version": int(at_version[parent]),
                }
        columns = [t[c].to_pylist() for c in ("_change_type", "version", "last_seq")]
        for i, (change, doc_version, last_seq, dispatched_seq) in enumerate(
            zip(*columns, t["dispatched_seq"].to_pylist(), strict=True)
        ):
            doc_id, version = str(ids[i]), int(at_version[i])
            row_no = numbers.get((doc_id, version), 0)
            numbers[(doc_id, version)] = row_no + 1
            shown = change != "delete" and int(doc_version) > 0
            rows.append(
                {
                    "table_id": table_id,
                    "document_id": doc_id,
                    "table_version": version,
                    "row_no": row_no,
                    "change": str(change),
                    "document_version": int(doc_version),
                    "last_seq": int(last_seq or 0),
                    "dispatched_seq": int(dispatched_seq or 0),
                    "messages": json.dumps(carried[i]) if shown else None,
                }
            )
    return rows, list(messages.values())

"""The SQL side of an erasure: its ledger (``outbox_erasures``) and the purge of the queue
database.

The purge deletes, in one transaction, every row holding one of the documents' messages: queue
rows and dead letters by message id (derived as the dispatcher derives them, for every seq of
every life the table still shows, ``message_id_for``) and by session id (a message's session is
its ordering key or, without one, its document's id), the documents' ``ProcessDocument``
commands (the same two keys: ``command_id_for``, session = id), duplicate-detection ids and inbox
records of those message ids, key holds of the documents, their session and claim rows, and the
trace's commit index rows naming them.

Why ``secure_delete``, ``VACUUM`` and a checkpoint on SQLite: a DELETE only marks a row's space
free, and the bytes stay in the file until the page is reused. ``PRAGMA secure_delete`` makes
SQLite overwrite the purge's own rows with zeros; but rows deleted earlier on connections
without it (the document's completed messages, a row moved to the dead letters: Debian's SQLite
has it on by default, other builds do not) left their bytes in free space, which only a
``VACUUM`` (a rebuilt file) removes. In WAL mode the new pages reach the database file at a
checkpoint, after which ``TRUNCATE`` empties the WAL that still held the old ones.
``secure_delete`` stays as the fallback for a VACUUM another writer refused. PostgreSQL keeps
dead tuples until VACUUM (docs/erasure.md says so).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.core.errors import OutboxError, QueueError
from outbox.core.model import command_id_for, message_id_for

log = logging.getLogger("outbox.erase")

#: Values per ``IN (...)`` list (SQLite's default variable limit is 32,766; PostgreSQL's 65,535).
CHUNK = 500

REQUESTED, ERASED, DONE = "requested", "erased", "done"


@dataclass(frozen=True)
class Lives:
    """What the table shows of one document: each life's incarnation and highest ``last_seq``."""

    doc_id: str
    last_seq: Mapping[str | None, int]

    def message_ids(self, table_id: str) -> list[str]:
        return [
            message_id_for(table_id, self.doc_id, seq, inc)
            for inc, top in self.last_seq.items()
            for seq in range(1, top + 1)
        ]

    def command_ids(self, table_id: str) -> list[str]:
        return [
            command_id_for(table_id, self.doc_id, seq, inc)
            for inc, top in self.last_seq.items()
            for seq in range(1, top + 1)
        ]


def hashed(table_id: str, doc_id: str) -> str:
    """What the ledger keeps of an erased id: ``sha256(table_id|id)``, to answer "was X
    erased?" without keeping X."""
    return hashlib.sha256(f"{table_id}|{doc_id}".encode()).hexdigest()


@contextmanager
def _engine(sql_url: str) -> Iterator[Any]:
    """A private engine (its own connections: the PRAGMAs must be on the ones that delete)."""
    from dispatcher.queue.database import open_engine

    engine = open_engine(sql_url)
    try:
        yield engine
    finally:
        engine.dispose()


def ledger_ready(sql_url: str) -> bool:
    """Whether the database exists and has the ledger (revision 0010)."""
    import sqlalchemy as sa

    try:
        with _engine(sql_url) as engine:
            return bool(sa.inspect(engine).has_table("outbox_erasures"))
    except (OutboxError, sa.exc.SQLAlchemyError):
        return False


def _require_ledger(sql_url: str) -> None:
    if not ledger_ready(sql_url):
        raise QueueError(
            "the SQL database has no erasure ledger (outbox_erasures)",
            hint="run `outbox migrate` (revision 0010 adds it)",
        )


def record(sql_url: str, table_id: str, ids: Sequence[str], now: datetime) -> None:
    """A ``requested`` row per id not in the ledger yet (an open erasure keeps its row)."""
    import sqlalchemy as sa

    from migrations.sql.tables import erasures

    _require_ledger(sql_url)
    with _engine(sql_url) as engine, engine.begin() as conn:
        have = set()
        for chunk in _chunks(ids):
            have.update(
                conn.execute(
                    sa.select(erasures.c.doc_id).where(
                        erasures.c.table_id == table_id, erasures.c.doc_id.in_(chunk)
                    )
                ).scalars()
            )
        new = {"table_id": table_id, "phase": REQUESTED, "requested_at": now}
        rows = [dict(new, doc_id=i) for i in dict.fromkeys(ids) if i not in have]
        if rows:
            conn.execute(sa.insert(erasures), rows)


def mark(
    sql_url: str,
    table_id: str,
    ids: Iterable[str],
    phase: str,
    *,
    now: datetime,
    version: int | None = None,
) -> None:
    """Move ``ids`` to ``phase`` (``erased`` with the erase commit's ``version``; ``done``
    replaces each id by its hash, and deletes the trace's index rows of the document once more:
    a trace between the purge and the log trim may have indexed its older commits again)."""
    import sqlalchemy as sa

    from migrations.sql.tables import commit_index, commit_index_messages, erasures

    with _engine(sql_url) as engine, engine.begin() as conn:
        for doc_id in ids:
            where = (erasures.c.table_id == table_id) & (erasures.c.doc_id == doc_id)
            if phase == ERASED:
                values: dict[str, Any] = {"phase": ERASED, "erased_version": version}
                values["erased_at"] = now
            else:
                values = {"phase": DONE, "finished_at": now, "doc_id": hashed(table_id, doc_id)}
                for index in (commit_index, commit_index_messages):
                    mine = (index.c.table_id == table_id) & (index.c.document_id == doc_id)
                    conn.execute(sa.delete(index).where(mine))
            conn.execute(sa.update(erasures).where(where).values(**values))
        _scrub(conn)


def ledger(sql_url: str, table_id: str, *, open_only: bool = False) -> list[dict[str, Any]]:
    """The ledger's rows of a table, oldest request first."""
    import sqlalchemy as sa

    from migrations.sql.tables import erasures

    query = sa.select(erasures).where(erasures.c.table_id == table_id)
    if open_only:
        query = query.where(erasures.c.phase != DONE)
    with _engine(sql_url) as engine, engine.connect() as conn:
        rows = conn.execute(query.order_by(erasures.c.requested_at, erasures.c.doc_id))
        return [dict(r._mapping) for r in rows]


def purge(sql_url: str, table_id: str, lives: Sequence[Lives]) -> dict[str, int]:
    """Delete every row of the queue database that holds the documents' messages (the module
    docstring lists them); rows deleted per table."""
    import sqlalchemy as sa

    from migrations.sql import tables as T

    doc_ids = [life.doc_id for life in lives]
    messages = [m for life in lives for m in life.message_ids(table_id)]
    messages += [c for life in lives for c in life.command_ids(table_id)]
    by_message_or_session = (T.queue_messages, T.dead_letters)
    counts: dict[str, int] = {}
    with _engine(sql_url) as engine, engine.begin() as conn:
        _scrub(conn)
        for table in by_message_or_session:
            for chunk in _chunks(messages):
                _count(
                    counts,
                    table,
                    conn.execute(sa.delete(table).where(table.c.message_id.in_(chunk))),
                )
            for chunk in _chunks(doc_ids):
                _count(
                    counts,
                    table,
                    conn.execute(sa.delete(table).where(table.c.session_id.in_(chunk))),
                )
        for table, column in (
            (T.duplicate_ids, T.duplicate_ids.c.message_id),
            (T.inbox, T.inbox.c.message_id),
        ):
            for chunk in _chunks(messages):
                _count(counts, table, conn.execute(sa.delete(table).where(column.in_(chunk))))
        for table, column in (
            (T.key_holds, T.key_holds.c.doc_id),
            (T.queue_sessions, T.queue_sessions.c.session_id),
            (T.claims, T.claims.c.session_id),
            (T.claim_sessions, T.claim_sessions.c.session_id),
            (T.commit_index, T.commit_index.c.document_id),  # the trace's index
            (T.commit_index_messages, T.commit_index_messages.c.document_id),
            (T.rescues, T.rescues.c.doc_id),  # the rescuer's journal
        ):
            for chunk in _chunks(doc_ids):
                _count(counts, table, conn.execute(sa.delete(table).where(column.in_(chunk))))
    checkpoint_wal(sql_url)
    return counts


def _count(counts: dict[str, int], table: Any, result: Any) -> None:
    counts[table.name] = counts.get(table.name, 0) + max(0, int(result.rowcount or 0))


def _scrub(conn: Any) -> None:
    """SQLite: overwrite deleted content with zeros on this connection (a no-op elsewhere)."""
    if conn.engine.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA secure_delete = ON")


def checkpoint_wal(sql_url: str) -> None:
    """SQLite: rebuild the file (``VACUUM``: free space still holds rows deleted earlier with
    ``secure_delete`` off, e.g. the document's messages completed long ago, or a row moved to
    the dead letters), then copy the new pages into the database file and empty the WAL, which
    still holds the pages as they were. Logged, not raised, when another connection is in the
    way: the finishing ``outbox maintain`` runs it again."""
    import sqlite3

    with _engine(sql_url) as engine:
        if engine.dialect.name != "sqlite":
            return
        raw = engine.raw_connection()  # outside any transaction: neither can run in one
        try:
            sqlite = raw.driver_connection
            assert sqlite is not None
            sqlite.commit()
            try:
                sqlite.execute("VACUUM")
            except sqlite3.OperationalError as e:
                log.warning(
                    "VACUUM of %s failed (%s): the next `outbox maintain` retries", sql_url, e
                )
            busy, *_ = sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            raw.close()
    if busy:
        log.warning(
            "the SQLite WAL could not be emptied (a reader holds it): erased rows may stay in "
            "%s-wal until the next `outbox maintain`",
            sql_url,
        )


def _chunks(values: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])

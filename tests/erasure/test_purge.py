"""The SQL purge and the ledger on SQLite and PostgreSQL: the document's queue rows and dead
letters go by message id (an ordering key of its own) and by session (the document id), other
documents' rows stay; on SQLite their bytes leave the file and the WAL; a finished erasure keeps
only the id's hash."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.app import erasure_sql as ledger
from outbox.core.model import message_id_for
from rescuer.journal import RescueEntry, SqlRescueJournal
from testkit.raw_scan import scan_folder

TABLE = "table-id-1"
NOW = datetime(2026, 11, 29, tzinfo=UTC)


@pytest.fixture
def migrated_url(sql_url: str) -> str:
    upgrade(sql_url)
    return sql_url


def _count(url: str, table: str, where: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.exec_driver_sql(f"SELECT count(*) FROM {table} WHERE {where}").scalar_one()
            )
    finally:
        engine.dispose()


@contextmanager
def sqlite_without_secure_delete() -> Iterator[None]:
    """Every new SQLite connection starts with ``secure_delete`` off, as in builds without
    ``SQLITE_SECURE_DELETE`` (Debian's has it on by default, which would hide a missing PRAGMA)."""
    real = sqlite3.connect

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real(*args, **kwargs)  # type: ignore[arg-type]
        conn.execute("PRAGMA secure_delete = OFF")
        return conn

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", connect)
        patch.setattr(sqlite3.dbapi2, "connect", connect)  # what SQLAlchemy's dialect calls
        yield


def test_purge_by_message_id_and_session_keeps_other_documents(migrated_url: str) -> None:
    """A queue stays open meanwhile (a running worker's connections), so SQLite does not
    checkpoint and delete the WAL by itself when the purge's connections close."""
    with sqlite_without_secure_delete(), SqlQueue(migrated_url) as worker:
        _purge_beside(worker, migrated_url)


def _purge_beside(queue: SqlQueue, migrated_url: str) -> None:
    marker, other = f"mk{uuid.uuid4().hex}", f"ok{uuid.uuid4().hex}"
    life = uuid.uuid4().hex
    keyed = message_id_for(TABLE, "p1", 1, life)  # sent under an ordering key of its own
    queue.send("people", QueueMessage(f"{marker} 1", message_id=keyed, session_id="key-7"))
    queue.send("people", QueueMessage(f"{marker} 2", session_id="p1"))
    queue.send("people", QueueMessage(f"{marker} 3", session_id="p1"))
    queue.send("people", QueueMessage(other, session_id="p2"))
    (poison,) = queue.receive("people", 1, session_id="p1")
    queue.dead_letter(poison, "Poison")
    ledger.record(migrated_url, TABLE, ["p1"], NOW)
    for doc_id in ("p1", "p2"):  # the rescuer's journal names documents too
        entry = RescueEntry(TABLE, doc_id, 1, f"pd-{doc_id}", "r", "local", "feed", 1, NOW)
        SqlRescueJournal(queue.database).record([entry])

    counts = ledger.purge(migrated_url, TABLE, [ledger.Lives("p1", {life: 1})])

    assert counts["outbox_rescues"] == 1
    assert _count(migrated_url, "outbox_rescues", "doc_id = 'p2'") == 1

    assert counts["outbox_queue_messages"] == 2
    assert counts["outbox_queue_dead_letters"] == 1
    assert _count(migrated_url, "outbox_queue_messages", "session_id = 'p2'") == 1
    assert _count(migrated_url, "outbox_queue_messages", "session_id <> 'p2'") == 0
    if migrated_url.startswith("sqlite"):
        folder = Path(migrated_url.removeprefix("sqlite:///")).parent
        assert scan_folder(folder, marker) == []  # secure_delete, then the WAL emptied
        assert scan_folder(folder, other) != []  # the scan sees what stays

    ledger.mark(migrated_url, TABLE, ["p1"], ledger.ERASED, now=NOW, version=7)
    ledger.mark(migrated_url, TABLE, ["p1"], ledger.DONE, now=NOW)
    (row,) = ledger.ledger(migrated_url, TABLE)
    assert (row["doc_id"], row["phase"], row["erased_version"]) == (
        ledger.hashed(TABLE, "p1"),
        "done",
        7,
    )

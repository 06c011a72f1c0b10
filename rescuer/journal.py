"""The rescuer's journal: which documents each pass commanded (``outbox_rescues``, migration
0014; issue 46, item 1: the trace shows "the rescuer passes that touched it").

Why: a rescued document's ``ProcessDocument`` command leaves the command queue once handled,
and the rescuer's checkpoint records versions, not ids; without this, nothing would say that
the rescuer touched a document. Each pass writes one row per command it enqueued (one insert
for the pass), after the enqueue: a row says the pass asked, and the worker's marks in the
table's history say what was then sent. Both engines go through ``RescuePass``, so both are in
it. The rescuer writes it when it already uses the SQL database (its checkpoints or its
commands are there: ``outbox.app.rescue``); a journal that cannot be written does not fail the
pass, whose commands are already sent (a warning says so). ``outbox maintain`` prunes it with
the console's samples (``sample_retention``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import delete, insert, select

from migrations.sql.tables import rescues as R
from outbox.core.clock import utc
from outbox.core.settings import Settings


@dataclass(frozen=True)
class RescueEntry:
    """One command a pass enqueued."""

    table_id: str
    doc_id: str
    up_to_seq: int
    command_id: str
    rescuer: str
    engine: str
    mode: str  # feed or sweep
    window_end: int | None  # the last version the pass read
    at: datetime


def kept(settings: Settings) -> bool:
    """Whether the rescuer of ``settings`` writes the journal: when it already uses the SQL
    database (its checkpoints or its commands are there). The trace reads it on the same rule."""
    return "sql" in (settings.checkpoint_store, settings.command_transport)


class Journal(Protocol):
    """Where a pass records what it commanded (``SqlRescueJournal``; a test's list)."""

    def record(self, entries: Sequence[RescueEntry]) -> None: ...


class SqlRescueJournal:
    """The journal in the SQL database (``database``: a ``dispatcher.queue.database.Database``)."""

    def __init__(self, database: Any) -> None:
        self._db = database

    def record(self, entries: Sequence[RescueEntry]) -> None:
        if not entries:
            return
        rows = [{**e.__dict__, "at": utc(e.at)} for e in entries]
        with self._db.write("record the rescuer's commands") as conn:
            conn.execute(insert(R), rows)

    def of_document(self, table_id: str, doc_id: str, limit: int = 50) -> list[RescueEntry]:
        """The document's entries, newest first."""
        q = (
            select(R)
            .where(R.c.table_id == table_id, R.c.doc_id == doc_id)
            .order_by(R.c.id.desc())
            .limit(limit)
        )
        with self._db.read("read the rescuer's journal") as conn:
            found = conn.execute(q).mappings().all()
        fields = RescueEntry.__dataclass_fields__
        return [RescueEntry(**{k: r[k] for k in fields} | {"at": utc(r["at"])}) for r in found]

    def prune(self, before: datetime) -> int:
        """Delete the entries older than ``before``; how many went."""
        with self._db.write("prune the rescuer's journal") as conn:
            return int(conn.execute(delete(R).where(R.c.at < before)).rowcount)

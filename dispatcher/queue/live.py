"""The live messages of a queue a page at a time, read-only: the console's live pages (issue 46,
item 2), as Service Bus Explorer peeks and RabbitMQ's management UI gets messages.

Why apart from the receiver's ``peek``: these pages filter by state (active, scheduled,
deferred, locked) in SQL and page by sequence number (the next page starts after the last one
shown), so a page costs about the same at the first and the last page of 100,000 messages;
lists leave the bodies out (one message's page shows it); and sessions are listed with their
head message. Nothing here locks, receives or changes a row, so nothing can race a consumer.

Who holds a lock is not something the queue knows: a lock is a random token the receiver keeps
(``lock_token``), never shown, and the queue records when it was taken and until when it holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, not_, or_, select

from dispatcher.queue.database import Database
from dispatcher.queue.messages import PeekedMessage
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.rows import peeked
from migrations.sql.tables import queue_messages as M
from migrations.sql.tables import queue_sessions as S

#: The states a live message can be in, as the pages name them.
STATES = ("active", "scheduled", "deferred", "locked")
#: Every column but the body, which a list never shows (a body can be 256 KiB).
_LISTED = [c for c in M.c if c.name != "body"]


@dataclass(frozen=True)
class LiveSession:
    """A session with messages in the queue: its head (the next to be delivered, in order),
    how many wait, and whether it is paused (a device offline)."""

    session_id: str
    messages: int
    head: PeekedMessage
    paused: bool
    state: str | None


def _state_condition(state: str, now: datetime) -> ColumnElement[bool]:
    locked = and_(M.c.locked_until.is_not(None), M.c.locked_until > now)
    if state == "locked":
        return locked
    free = or_(M.c.locked_until.is_(None), M.c.locked_until <= now)
    if state == "deferred":
        return and_(free, M.c.deferred)
    if state == "scheduled":
        return and_(free, not_(M.c.deferred), M.c.not_before > now)
    if state == "active":
        return and_(free, not_(M.c.deferred), M.c.not_before <= now)
    raise ValueError(f"no such state {state!r}: one of {', '.join(STATES)}")


class LiveBrowser:
    """Paged, read-only views of one ``SqlQueue``'s live messages (thread safe, like it)."""

    def __init__(self, database: Database, options: QueueOptions) -> None:
        self._db = database
        self._options = options

    def page(
        self, queue: str, state: str | None = None, *, after: int | None = None, limit: int = 50
    ) -> list[PeekedMessage]:
        """Messages of ``queue`` in delivery order (sequence number), those in ``state`` only
        when given, starting after sequence number ``after``; bodies left out (``message``)."""
        now = self._options.now()
        stmt = select(*_LISTED).where(M.c.queue == queue)
        if state is not None:
            stmt = stmt.where(_state_condition(state, now))
        if after is not None:
            stmt = stmt.where(M.c.sequence_number > after)
        with self._db.read("list live messages") as conn:
            rows = conn.execute(stmt.order_by(M.c.sequence_number).limit(limit)).mappings()
            return [peeked(r, now) for r in rows]

    def message(self, queue: str, sequence_number: int) -> PeekedMessage | None:
        """One live message with its body; None when it is no longer there (settled since)."""
        now = self._options.now()
        stmt = select(M).where(M.c.queue == queue, M.c.sequence_number == sequence_number)
        with self._db.read("show a live message") as conn:
            row = conn.execute(stmt).mappings().first()
        if row is None:
            return None
        return peeked(row, now)

    def headers(self, queue: str, sequence_number: int) -> Any:
        """A live message's application headers (a JSON object as stored; the stored text
        itself if it is not JSON); None when the message is gone."""
        stmt = select(M.c.headers).where(M.c.queue == queue, M.c.sequence_number == sequence_number)
        with self._db.read("show a live message's headers") as conn:
            value = conn.execute(stmt).scalar()
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError:
            return str(value)

    def counts(self, queue: str) -> dict[str, int]:
        """How many messages of ``queue`` are in each state now (one pass over its rows)."""
        now = self._options.now()
        columns = [func.count().filter(_state_condition(s, now)).label(s) for s in STATES]
        with self._db.read("count live messages") as conn:
            row = conn.execute(select(*columns).where(M.c.queue == queue)).mappings().one()
        return {s: int(row[s] or 0) for s in STATES}

    def sessions(
        self, queue: str, *, after: str | None = None, limit: int = 50
    ) -> list[LiveSession]:
        """Sessions of ``queue`` with messages, by id after ``after``: each with its head
        message (the lowest sequence number: the next one the session delivers), its count and
        its paused state."""
        now = self._options.now()
        grouped = (
            select(
                M.c.session_id,
                func.min(M.c.sequence_number).label("head"),
                func.count().label("messages"),
            )
            .where(M.c.queue == queue, M.c.session_id.is_not(None))
            .group_by(M.c.session_id)
            .order_by(M.c.session_id)
            .limit(limit)
        )
        if after is not None:
            grouped = grouped.where(M.c.session_id > after)
        with self._db.read("list live sessions") as conn:
            groups = conn.execute(grouped).mappings().all()
            if not groups:
                return []
            heads = {
                int(r["sequence_number"]): dict(r)
                for r in conn.execute(
                    select(*_LISTED).where(
                        M.c.sequence_number.in_([int(g["head"]) for g in groups])
                    )
                ).mappings()
            }
            states = {
                r["session_id"]: (bool(r["paused"]), r["state"])
                for r in conn.execute(
                    select(S.c.session_id, S.c.paused, S.c.state).where(
                        S.c.queue == queue,
                        S.c.session_id.in_([g["session_id"] for g in groups]),
                    )
                ).mappings()
            }
        out = []
        for g in groups:
            head = heads.get(int(g["head"]))
            if head is None:  # settled between the two reads (PostgreSQL reads committed rows)
                continue
            paused, state = states.get(g["session_id"], (False, None))
            out.append(
                LiveSession(
                    session_id=str(g["session_id"]),
                    messages=int(g["messages"]),
                    head=peeked(head, now),
                    paused=paused,
                    state=state,
                )
            )
        return out

"""Session states and settlement by message id: what a device gateway needs from the SQL queue so
that a device waiting for an ack holds no thread, only rows (docs/devices.md).

* **Pause.** A paused session is left out of every receive (``SqlQueueReceiver`` checks its row),
  so an offline device's tasks wait in the queue without being delivered or using up tries. A
  session without a row is not paused. ``state`` and ``since`` say, for people, what the session's
  owner is (``online``/``offline``) and since when; an unchanged state keeps its ``since``.
* **Return to the line.** ``return_to_line`` unlocks the task a paused session had out and takes
  its delivery back (``delivery_count - 1``): the device went offline holding it, so that try is
  not held against it.
* **Complete by id.** A device acks a message id, not a lock token, and the ack may reach any
  gateway process, or one restarted since the publish. ``complete_delivered`` deletes the
  session's delivered task with that id (one that was handed out at least once and is still in
  the queue) whoever holds its lock: the device has done it. An ack for a task never delivered,
  already completed, or on another device's session changes nothing and is reported back.

SQL queue only: Service Bus has no paused sessions and settles only by lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, delete, func, select, tuple_, update

from dispatcher.queue import validation
from dispatcher.queue.database import Database
from dispatcher.queue.messages import as_utc
from dispatcher.queue.options import QueueOptions
from migrations.sql.tables import queue_messages, queue_sessions

M = queue_messages
S = queue_sessions
#: Rows per statement: well under SQLite's 32,766 bound parameters.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class SessionState:
    """One session's state: paused or not, a word for people, and since when."""

    session_id: str
    paused: bool
    state: str | None
    since: datetime


@dataclass(frozen=True, slots=True)
class StateChange:
    """What ``set_states`` is to record for one session."""

    session_id: str
    paused: bool
    state: str | None = None


class SqlSessions:
    """The session-state part of one ``SqlQueue`` (thread safe, like the queue)."""

    def __init__(self, db: Database, options: QueueOptions) -> None:
        self._db = db
        self._options = options

    def set_states(
        self, queue: str, changes: Sequence[StateChange], *, at: datetime | None = None
    ) -> list[str]:
        """Record each change in one transaction; returns the sessions whose state changed
        (``since`` moves to ``at``, default now; a repeat of the same state keeps its ``since``).
        The last change of a session wins when it is named twice."""
        validation.queue_name(queue)
        last = {c.session_id: c for c in changes}
        for name in last:
            validation.identifier("session_id", name)
        if not last:
            return []
        now = self._options.now()
        when = at or now
        changed: list[str] = []
        with self._db.write("record session states") as conn:
            if self._db.postgres:  # gateways starting together insert the same sessions' rows
                conn.execute(
                    select(
                        func.pg_advisory_xact_lock(func.hashtextextended(f"sessions:{queue}", 0))
                    )
                )
            names = list(last)
            known: dict[str, tuple[bool, str | None]] = {}
            for i in range(0, len(names), _CHUNK):
                rows = conn.execute(
                    select(S.c.session_id, S.c.paused, S.c.state).where(
                        S.c.queue == queue, S.c.session_id.in_(names[i : i + _CHUNK])
                    )
                )
                known.update({r.session_id: (bool(r.paused), r.state) for r in rows})
            inserts = []
            for name, c in last.items():
                if name not in known:
                    inserts.append(
                        {
                            "queue": queue,
                            "session_id": name,
                            "paused": c.paused,
                            "state": c.state,
                            "since": when,
                            "updated_at": now,
                        }
                    )
                    changed.append(name)
                elif known[name] != (c.paused, c.state):
                    conn.execute(
                        update(S)
                        .where(S.c.queue == queue, S.c.session_id == name)
                        .values(paused=c.paused, state=c.state, since=when, updated_at=now)
                    )
                    changed.append(name)
            if inserts:
                conn.execute(S.insert(), inserts)
        return changed

    def states(self, queue: str, sessions: Iterable[str] | None = None) -> dict[str, SessionState]:
        """The recorded states of ``queue``'s sessions (all of them, or those named)."""
        validation.queue_name(queue)
        stmt = select(S).where(S.c.queue == queue)
        wanted = None if sessions is None else list(sessions)
        out: dict[str, SessionState] = {}
        with self._db.read("read session states") as conn:
            chunks = (
                [stmt]
                if wanted is None
                else [
                    stmt.where(S.c.session_id.in_(wanted[i : i + _CHUNK]))
                    for i in range(0, len(wanted), _CHUNK)
                ]
            )
            for chunk in chunks:
                for r in conn.execute(chunk).mappings():
                    since = as_utc(r["since"])
                    assert since is not None
                    out[r["session_id"]] = SessionState(
                        r["session_id"], bool(r["paused"]), r["state"], since
                    )
        return out

    def return_to_line(self, queue: str, sessions: Sequence[str]) -> int:
        """Unlock the delivered, unsettled task of each session and take its delivery back
        (see the module docstring); returns how many tasks went back."""
        validation.queue_name(queue)
        if not sessions:
            return 0
        back = 0
        with self._db.write("return tasks to the line") as conn:
            for i in range(0, len(sessions), _CHUNK):
                result = conn.execute(
                    update(M)
                    .where(
                        M.c.queue == queue,
                        M.c.session_id.in_(sessions[i : i + _CHUNK]),
                        M.c.lock_token.is_not(None),
                        ~M.c.deferred,
                    )
                    .values(
                        lock_token=None,
                        locked_until=None,
                        delivery_count=M.c.delivery_count - 1,
                    )
                )
                back += int(result.rowcount)
        return back

    def complete_delivered(
        self, queue: str, acks: Sequence[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """Delete each delivered task named by ``(session_id, message_id)``, in one transaction;
        returns the pairs that matched no delivered task (see the module docstring)."""
        validation.queue_name(queue)
        pairs = list(dict.fromkeys(acks))
        if not pairs:
            return []
        found: set[tuple[str, str]] = set()
        with self._db.write("complete acked tasks") as conn:
            for i in range(0, len(pairs), _CHUNK):
                chunk = pairs[i : i + _CHUNK]
                # delivered: locked at least once (a token is set by every receive and cleared
                # only by an abandon or a return to the line), not set aside by a defer
                delivered = and_(
                    M.c.queue == queue,
                    # the plain IN lets SQLite use the (queue, session_id) index: with the pair
                    # alone it reads every row of the queue
                    M.c.session_id.in_({s for s, _ in chunk}),
                    tuple_(M.c.session_id, M.c.message_id).in_(chunk),
                    M.c.lock_token.is_not(None),
                    ~M.c.deferred,
                )
                rows = conn.execute(
                    select(M.c.sequence_number, M.c.session_id, M.c.message_id).where(delivered)
                ).all()
                if rows:
                    conn.execute(delete(M).where(M.c.sequence_number.in_([r[0] for r in rows])))
                found.update((r[1], r[2]) for r in rows)
        return [p for p in pairs if p not in found]

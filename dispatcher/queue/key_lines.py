"""Where paused ordering keys and their held lines live, so that every process that sends sees
them: in memory for one process, or in the SQL queue's database for all of them.

A *line* is what a paused key makes its messages wait in (docs/dispatcher.md, "Order per
ordering key"). It is a list of *holds* in the order they were made: each hold is a run of one
document's messages of that key (``seq`` to ``last_seq``, first message ``message_id``). The
first hold is the key's **gate**: only its messages may be sent; once they are delivered the
gate passes to the next hold, and when the line is empty the key is open again. A message of a
paused key joins the line where ``placement`` says: inside a hold that already covers it, at the
end of the last hold when that hold is its own document's (one document's messages committed
back to back stay one run), else as a new hold at the end. So the line keeps the order in which
messages first met the paused key, which is the order they were committed in one process, and
every process that sends consults the same line.

Why in the queue's database: the documents held behind a gate are retried by commands, and the
command worker (``outbox run-dispatcher``) is another process; with the line in memory it knew
nothing of the writer's, so order across documents held only until the first failed send.

Why apart from ``dispatcher.keys``: this is storage (the queue's floor); the key order in the
dispatch is the one place that decides what to send.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.engine import Connection

from dispatcher.queue.database import Database
from migrations.sql.tables import key_holds

#: An ordering key as the broker sees it: (destination, session). Sessions are per entity.
Key = tuple[str, str]
#: A hold's reason is cut to this many characters (the error that paused the key).
REASON_CHARS = 1000
#: Keys per statement: well under SQLite's 32,766 bound parameters.
_CHUNK = 400

H = key_holds
_ANY_HOLD = f"SELECT 1 FROM {key_holds.name} LIMIT 1"


@dataclass(frozen=True, slots=True)
class Hold:
    """A run of one document's messages of one key, waiting in the key's line."""

    doc_id: str
    seq: int  # its first message
    last_seq: int  # its last message (the run may grow while it is the line's last hold)
    message_id: str  # the first message's id
    incarnation: str | None = None  # the document's life the messages belong to
    entry_id: int = 0  # its place in the store (increasing: the line's order)
    since: datetime | None = None
    reason: str = ""

    def covers(self, doc_id: str, incarnation: str | None, seq: int) -> bool:
        return (
            self.doc_id == doc_id
            and self.incarnation == incarnation
            and self.seq <= seq <= self.last_seq
        )

    def same_life(self, doc_id: str, incarnation: str | None) -> bool:
        return self.doc_id == doc_id and self.incarnation == incarnation


@dataclass(frozen=True, slots=True)
class Wait:
    """A message that must wait in its key's line: the key, its document, life and seq."""

    key: Key
    doc_id: str
    incarnation: str | None
    seq: int
    message_id: str


Placement = tuple[Literal["covered", "extend", "append"], Hold | None]


def placement(line: Sequence[Hold], w: Wait) -> Placement:
    """Where ``w`` goes in ``line``: already in a hold, at the end of the last hold (its own
    document's), or a new hold at the end."""
    for h in line:
        if h.covers(w.doc_id, w.incarnation, w.seq):
            return ("covered", h)
    if line and line[-1].same_life(w.doc_id, w.incarnation) and w.seq > line[-1].last_seq:
        return ("extend", line[-1])
    return ("append", None)


class KeyLines(Protocol):
    """The lines of paused keys, shared by every dispatcher that uses the same store.

    Every method returns the lines as they are after it (a key missing from the answer is
    open). Removing a hold names it by ``entry_id``, so a repeat (two processes delivering the
    same gate, a resume called twice) removes nothing more."""

    def paused_among(self, keys: Collection[Key]) -> dict[Key, list[Hold]]:
        """The lines of those of ``keys`` that are paused (normally none: one cheap read)."""
        ...

    def hold(self, waits: Sequence[Wait], reason: str, at: datetime) -> dict[Key, list[Hold]]:
        """Put each wait in its key's line, in order (an open key is paused with it as the
        gate); the lines of the keys named."""
        ...

    def remove(
        self, key: Key, entry_ids: Collection[int], up_to: Mapping[int, int] | None = None
    ) -> list[Hold]:
        """Take the holds ``entry_ids`` out of ``key``'s line (delivered, or given up on). With
        ``up_to`` (entry id -> the last seq known delivered), a hold whose run another process
        extended past that since it was read stays: its later messages are not delivered."""
        ...

    def open(self, key: Key) -> bool:
        """Empty ``key``'s line; False when it was open."""
        ...

    def lines(self, limit: int | None = None) -> dict[Key, list[Hold]]:
        """Every paused key's line (at most ``limit`` keys), for people and the worker."""
        ...


class MemoryKeyLines:
    """The lines of one process (the default when no database is shared)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[Key, list[Hold]] = {}
        self._next = 1

    def paused_among(self, keys: Collection[Key]) -> dict[Key, list[Hold]]:
        with self._lock:
            if not self._lines:
                return {}
            if len(keys) > len(self._lines):
                return {k: list(v) for k, v in self._lines.items() if k in keys}
            return {k: list(line) for k in keys if (line := self._lines.get(k))}

    def hold(self, waits: Sequence[Wait], reason: str, at: datetime) -> dict[Key, list[Hold]]:
        with self._lock:
            for w in waits:
                line = self._lines.setdefault(w.key, [])
                where, h = placement(line, w)
                if where == "extend":
                    assert h is not None
                    line[-1] = _extended(h, w.seq)
                elif where == "append":
                    line.append(self._new(w, reason if not line else "", at))
            return {w.key: list(self._lines[w.key]) for w in waits}

    def _new(self, w: Wait, reason: str, at: datetime) -> Hold:
        h = Hold(
            w.doc_id,
            w.seq,
            w.seq,
            w.message_id,
            w.incarnation,
            self._next,
            at,
            reason[:REASON_CHARS],
        )
        self._next += 1
        return h

    def remove(
        self, key: Key, entry_ids: Collection[int], up_to: Mapping[int, int] | None = None
    ) -> list[Hold]:
        with self._lock:
            line = self._lines.get(key)
            if line is None:
                return []
            line[:] = [h for h in line if not _removable(h, entry_ids, up_to)]
            if not line:
                del self._lines[key]
            return list(line)

    def open(self, key: Key) -> bool:
        with self._lock:
            return self._lines.pop(key, None) is not None

    def lines(self, limit: int | None = None) -> dict[Key, list[Hold]]:
        with self._lock:
            items = sorted(self._lines.items(), key=lambda kv: kv[1][0].entry_id)
            return {k: list(v) for k, v in items[:limit]}


def _removable(h: Hold, entry_ids: Collection[int], up_to: Mapping[int, int] | None) -> bool:
    if h.entry_id not in entry_ids:
        return False
    return up_to is None or h.last_seq <= up_to.get(h.entry_id, h.last_seq)


def _extended(h: Hold, seq: int) -> Hold:
    return Hold(h.doc_id, h.seq, seq, h.message_id, h.incarnation, h.entry_id, h.since, h.reason)


class SqlKeyLines:
    """The lines in the SQL queue's database (``outbox_key_holds``), shared by every process.

    A line's order is the holds' ids (``AUTOINCREMENT`` on SQLite, an identity on PostgreSQL:
    never reused). Putting messages in lines is one write transaction per call, and on
    PostgreSQL it first takes a transaction-level advisory lock per key, so two processes
    holding on one key append one after the other."""

    def __init__(self, db: Database | Callable[[], Database]) -> None:
        """``db``, or a function that gives it on first use (the queue's database is opened
        lazily: a process whose sends never fail may never need it otherwise)."""
        self._open = db if callable(db) else (lambda: db)
        self._opened: Database | None = None

    @property
    def _db(self) -> Database:
        if self._opened is None:
            self._opened = self._open()
        return self._opened

    def paused_among(self, keys: Collection[Key]) -> dict[Key, list[Hold]]:
        with self._db.read("read the paused ordering keys") as c:
            # the usual answer, an empty table, from one probe in the driver's own SQL (no
            # statement to compile or cache-look-up per dispatch); the keys only when it is not
            if c.exec_driver_sql(_ANY_HOLD).first() is None:
                return {}
            paused = {
                (r.destination, r.ordering_key)
                for r in c.execute(select(H.c.destination, H.c.ordering_key).distinct())
            }
            if not paused:
                return {}
            wanted = {k for k in paused if k in keys}
            return self._read(c, wanted) if wanted else {}

    def hold(self, waits: Sequence[Wait], reason: str, at: datetime) -> dict[Key, list[Hold]]:
        if not waits:
            return {}
        keys = sorted({w.key for w in waits})
        with self._db.write("hold messages behind a paused ordering key") as c:
            self._lock_keys(c, keys)
            lines = self._read(c, set(keys))
            for w in waits:
                line = lines.setdefault(w.key, [])
                where, h = placement(line, w)
                if where == "extend":
                    assert h is not None
                    c.execute(update(H).where(H.c.id == h.entry_id).values(last_seq=w.seq))
                    line[-1] = _extended(h, w.seq)
                elif where == "append":
                    why = "" if line else reason[:REASON_CHARS]
                    inserted = c.execute(
                        H.insert().values(
                            destination=w.key[0],
                            ordering_key=w.key[1],
                            doc_id=w.doc_id,
                            incarnation=w.incarnation,
                            seq=w.seq,
                            last_seq=w.seq,
                            message_id=w.message_id,
                            since=at,
                            reason=why,
                        )
                    ).inserted_primary_key
                    assert inserted is not None
                    new_id = inserted[0]
                    line.append(
                        Hold(
                            w.doc_id,
                            w.seq,
                            w.seq,
                            w.message_id,
                            w.incarnation,
                            int(new_id),
                            at,
                            why,
                        )
                    )
            return {k: lines.get(k, []) for k in keys}

    def remove(
        self, key: Key, entry_ids: Collection[int], up_to: Mapping[int, int] | None = None
    ) -> list[Hold]:
        ids = list(entry_ids)
        with self._db.write("let a paused ordering key's line move on") as c:
            self._lock_keys(c, [key])
            of_key = (H.c.destination == key[0], H.c.ordering_key == key[1])
            if up_to is None:
                if ids:
                    c.execute(delete(H).where(H.c.id.in_(ids), *of_key))
            else:  # a hold at a time: each with its own bound (a line holds few)
                for i in ids:
                    bound = (H.c.last_seq <= up_to[i],) if i in up_to else ()
                    c.execute(delete(H).where(H.c.id == i, *of_key, *bound))
            return self._read(c, {key}).get(key, [])

    def _lock_keys(self, c: Connection, keys: Sequence[Key]) -> None:
        """On PostgreSQL, a transaction-level advisory lock per key, taken in one order (two
        writers never wait on each other): a hold's read-then-extend and a removal of the same
        line go one after the other (READ COMMITTED would let an extend hit a deleted row). On
        SQLite a write transaction already excludes every other."""
        if not self._db.postgres:
            return
        for k in sorted(keys):
            c.execute(
                select(
                    func.pg_advisory_xact_lock(
                        func.hashtextextended(f"outbox-key:{k[0]}\x1f{k[1]}", 0)
                    )
                )
            )

    def open(self, key: Key) -> bool:
        with self._db.write("resume a paused ordering key") as c:
            self._lock_keys(c, [key])
            gone = c.execute(delete(H).where(H.c.destination == key[0], H.c.ordering_key == key[1]))
            return bool(gone.rowcount)

    def lines(self, limit: int | None = None) -> dict[Key, list[Hold]]:
        with self._db.read("read the paused ordering keys") as c:
            first = (
                select(H.c.destination, H.c.ordering_key, func.min(H.c.id).label("first"))
                .group_by(H.c.destination, H.c.ordering_key)
                .order_by(func.min(H.c.id))
            )
            if limit is not None:
                first = first.limit(limit)
            keys = {(r.destination, r.ordering_key) for r in c.execute(first)}
            lines = self._read(c, keys) if keys else {}
        return dict(sorted(lines.items(), key=lambda kv: kv[1][0].entry_id))

    def count(self) -> int:
        """How many keys are paused."""
        with self._db.read("count the paused ordering keys") as c:
            keys = select(H.c.destination, H.c.ordering_key).distinct().subquery()
            return int(c.execute(select(func.count()).select_from(keys)).scalar_one())

    @staticmethod
    def _read(c: Connection, keys: Iterable[Key]) -> dict[Key, list[Hold]]:
        wanted = list(keys)
        out: dict[Key, list[Hold]] = {}
        for i in range(0, len(wanted), _CHUNK):
            part = wanted[i : i + _CHUNK]
            rows = c.execute(
                select(H)
                .where(tuple_(H.c.destination, H.c.ordering_key).in_(part))
                .order_by(H.c.id)
            )
            for r in rows:
                out.setdefault((r.destination, r.ordering_key), []).append(
                    Hold(
                        r.doc_id,
                        int(r.seq),
                        int(r.last_seq),
                        r.message_id,
                        r.incarnation,
                        int(r.id),
                        _utc(r.since),
                        r.reason or "",
                    )
                )
        return out


def _utc(at: datetime | None) -> datetime | None:
    if at is None or at.tzinfo is not None:
        return at
    return at.replace(tzinfo=UTC)  # SQLite hands back naive times

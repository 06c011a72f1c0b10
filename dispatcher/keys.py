"""Per-key order: the line each ordering key's sends wait in within one process, and the paused
keys with their held lines, which every process that shares a ``KeyLines`` store sees.

Two things order one key's messages across documents (docs/dispatcher.md, "Order per ordering
key"):

* **Turns (one process).** ``take``/``wait_turn``/``release``: each dispatched chunk takes a
  ticket with its keys, and waits until no earlier ticket still in flight shares a key with it,
  so one key's sends leave in the order ``dispatch`` was called.
* **Paused keys (every process sharing the store).** When a document stops with unsent
  messages, each of their keys gets a line in the ``KeyLines`` store
  (``dispatcher.queue.key_lines``): the first hold is the gate, later messages of the key from
  any document wait behind it in the order they first met the paused key, and the gate passes
  hold by hold as messages are delivered. With the store in the queue's database (the default
  beside a server transport) the writer, the command worker and the Spark job share the lines.

``KeyOrder`` keeps a *view* of the paused lines of the keys it is dispatching, read once per
dispatch (``refresh``: one cheap read when nothing is paused) and updated by its own changes,
which it writes through to the store. A view can be a moment old: another process that pauses a
key just after this one read it may not hold this process's next send (the race between a failed
send and its record, which no outbox closes without a lock around every send); what the view
says paused is never sent out of line.

Why apart from the send loop (``dispatch``): this is the state the loop consults (is it my turn?
may this message go? who goes next?), under its own condition variable; the loop is the one place
that acts on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import UTC, datetime

from dispatcher.queue.key_lines import (
    REASON_CHARS,
    Hold,
    Key,
    KeyLines,
    MemoryKeyLines,
    Wait,
    placement,
)
from outbox.core.model import DocumentRow, OutboxMessage

log = logging.getLogger("outbox.dispatcher")

__all__ = ["Hold", "Key", "KeyOrder", "Wait", "key_of"]


def _now() -> datetime:
    return datetime.now(UTC)


def key_of(message: OutboxMessage, doc_id: str) -> Key:
    """The message's ordering key: its session (``ordering_key``, else the document id) on its
    destination."""
    return (message.destination, message.ordering_key or doc_id)


class KeyOrder:
    """One process's turns per ordering key, and its view of the paused keys' lines (thread
    safe)."""

    def __init__(self, lines: KeyLines | None = None) -> None:
        self.lines: KeyLines = lines if lines is not None else MemoryKeyLines()
        self._cond = threading.Condition()
        self._next = 0
        #: The tickets in flight in the order taken, each with its send's keys: one entry per
        #: send (a line per key made a 1,000-document send take and release 1,000 lines).
        self._tickets: dict[int, AbstractSet[Key]] = {}
        self._view: dict[Key, list[Hold]] = {}
        self._local = 0  # ids of holds kept only here while the store fails (negative)
        self._warned = -60.0

    # --- turns (this process) -----------------------------------------------------------------

    def take(self, keys: AbstractSet[Key]) -> int:
        """A ticket at the end of the line, for a send of ``keys`` (kept, not copied)."""
        with self._cond:
            ticket = self._next
            self._next += 1
            self._tickets[ticket] = keys
            return ticket

    def my_turn(self, ticket: int) -> bool:
        """Is ``ticket`` first in line for each of its keys (no earlier ticket in flight shares
        one)? The scan stops at ``ticket``: a dispatch alone in line looks at itself only."""
        with self._cond:
            return self._first(ticket)

    def _first(self, ticket: int) -> bool:
        keys = self._tickets[ticket]
        for earlier, theirs in self._tickets.items():
            if earlier >= ticket:
                return True
            if not keys.isdisjoint(theirs):
                return False
        return True

    def wait_turn(self, ticket: int) -> None:
        """Block until ``ticket`` is first in line for each of its keys."""
        with self._cond:
            if not self._first(ticket):
                self._cond.wait_for(lambda: self._first(ticket))

    def release(self, ticket: int) -> None:
        """The ticket's send is over (or never ran): later tickets of its keys may go."""
        with self._cond:
            if self._tickets.pop(ticket, None) is not None:
                self._cond.notify_all()

    # --- the paused keys' lines ---------------------------------------------------------------

    def refresh(self, keys: Collection[Key]) -> None:
        """Read the lines of ``keys`` from the store (a dispatch's keys, before it sends). A
        store that cannot be read leaves the view as it was (see ``_unavailable``); holds this
        process kept only in its view while the store failed are written to it first."""
        try:
            self._flush_local()
            fresh = self.lines.paused_among(keys)
        except Exception as e:
            self._unavailable("read", e)
            return
        with self._cond:
            for k in [k for k in self._view if k in keys and k not in fresh]:
                del self._view[k]
            self._view.update(fresh)

    def any_paused(self) -> bool:
        """Is any key of the view paused? (When none is, a chunk skips the per-message check.)"""
        with self._cond:
            return bool(self._view)

    def blocking(self, key: Key, row: DocumentRow, seq: int) -> Hold | None:
        """The gate that holds message ``seq`` of ``row`` back, or None when it may go: its key
        is open, or the gate is this document's and covers it, or is the line's only hold (the
        message would join it: nothing else waits between them). A gate of an ended life of this
        document (deleted and created again) is given up on first: its messages will never be
        sent (found by the checker's seed 23)."""
        while True:
            with self._cond:
                line = self._view.get(key)
                if not line:
                    return None
                gate = line[0]
            if gate.doc_id == row.id and gate.incarnation != row.incarnation:
                self._remove(key, [gate], f"{gate.message_id} belongs to an ended life")
                continue
            if gate.same_life(row.id, row.incarnation) and (seq <= gate.last_seq or len(line) == 1):
                return None  # the gate's own, or its document's next with nobody behind it
            return gate

    def hold(self, waits: Sequence[Wait], reason: str) -> None:
        """Put ``waits`` in their keys' lines, in order; an open key is paused at its first."""
        if not waits:
            return
        with self._cond:
            opened = {w.key for w in waits if not self._view.get(w.key)}
        try:
            self._flush_local()  # its own holds first: they came first
            lines = self.lines.hold(waits, reason, _now())
        except Exception as e:
            self._unavailable("write", e)
            lines = self._hold_here(waits, reason)
        self._take(lines)
        for k in sorted(opened):
            new = lines.get(k)
            if new:
                gate = new[0]
                log.warning(
                    "ordering key %s/%s paused at message %s (document %r seq %d): later "
                    "messages of this key wait until it is delivered",
                    k[0],
                    k[1],
                    gate.message_id,
                    gate.doc_id,
                    gate.seq,
                )

    def delivered(self, row: DocumentRow, up_to_seq: int, keys: Iterable[Key]) -> None:
        """``row``'s messages up to ``up_to_seq`` were delivered: every gate of ``keys`` that
        they complete passes on."""
        for k in keys:
            with self._cond:
                line = self._view.get(k)
                done = [
                    h
                    for h in (line or ())
                    if h.same_life(row.id, row.incarnation) and h.last_seq <= up_to_seq
                ]
            if done:
                bound = {h.entry_id: up_to_seq for h in done}
                self._remove(k, done, f"{done[0].message_id} was delivered", up_to=bound)

    def seen(self, rows: Iterable[DocumentRow]) -> None:
        """Take out of the lines whatever the rows' watermarks show delivered (by anyone), and
        the holds of ended lives; gates pass on."""
        with self._cond:
            if not self._view:  # the usual case: no pass over the rows
                return
            view = {k: list(v) for k, v in self._view.items()}
        marks = {r.id: (r.dispatched_seq, r.incarnation) for r in rows}

        def gone(h: Hold) -> bool:
            mark, life = marks.get(h.doc_id, (-1, h.incarnation))
            # delivered, or the document was deleted and created again: a message of its old
            # life will never be sent, and waiting for it would stop the key for good
            return mark >= h.last_seq or life != h.incarnation

        for k, line in view.items():
            done = [h for h in line if h.doc_id in marks and gone(h)]
            if done:  # a delivered run that grew since the view was read stays (its rest is not)
                bound = {
                    h.entry_id: marks[h.doc_id][0]
                    for h in done
                    if marks[h.doc_id][1] == h.incarnation
                }
                self._remove(k, done, f"{done[0].message_id} was delivered", up_to=bound)

    def give_up(self, key: Key, holds: Sequence[Hold], why: str) -> None:
        """Take ``holds`` out of ``key``'s line: their messages will never be sent."""
        self._remove(key, holds, why)

    def forget(self, doc_ids: Collection[str]) -> None:
        """The documents ``doc_ids`` are gone (deleted): their holds leave every line."""
        for k, line in self.all_lines().items():
            gone = [h for h in line if h.doc_id in doc_ids]
            if gone:
                self._remove(k, gone, f"document {gone[0].doc_id!r} was deleted")

    def resume(self, key: Key, message_id: str | None = None) -> bool:
        """Give up on ``key``'s gate when it is message ``message_id`` (the gate passes to the
        next hold), or with no message id open the key (every held document goes when its retry
        comes). Either is idempotent: a repeat finds the gate passed or the key open and does
        nothing (returns False)."""
        if message_id is None:
            opened = self.lines.open(key)
            with self._cond:
                self._view.pop(key, None)
            if opened:
                log.info("ordering key %s/%s resumed by hand: its line was emptied", *key)
            return opened
        line = self.lines.paused_among({key}).get(key, [])
        if not line or line[0].message_id != message_id:
            return False
        # strict: an operator's resume that could not be written says so (it must not print
        # that the gate was given up on while the store still holds it)
        self._remove(key, [line[0]], f"{message_id} was given up on by hand", strict=True)
        return True

    def _remove(
        self,
        key: Key,
        holds: Sequence[Hold],
        why: str,
        *,
        up_to: Mapping[int, int] | None = None,
        strict: bool = False,
    ) -> None:
        """Take ``holds`` out of ``key``'s line; ``up_to`` bounds delivered runs (see
        ``KeyLines.remove``)."""
        ids = {h.entry_id for h in holds}
        try:
            self._flush_local()
            line = self.lines.remove(key, ids, up_to)
        except Exception as e:
            if strict:
                raise
            self._unavailable("write", e)
            with self._cond:
                line = [
                    h
                    for h in self._view.get(key, ())
                    if h.entry_id not in ids
                    or (up_to is not None and h.last_seq > up_to.get(h.entry_id, h.last_seq))
                ]
        with self._cond:
            before = self._view.get(key)
            if line:
                self._view[key] = line
            else:
                self._view.pop(key, None)
        if before and (not line or line[0].entry_id != before[0].entry_id):
            if line:
                log.info(
                    "ordering key %s/%s: %s; document %r goes next (message %s)",
                    *key,
                    why,
                    line[0].doc_id,
                    line[0].message_id,
                )
            else:
                log.info("ordering key %s/%s resumed: %s", *key, why)

    def _hold_here(self, waits: Sequence[Wait], reason: str) -> dict[Key, list[Hold]]:
        """``hold`` in this process's view only, for when the store cannot be written."""
        with self._cond:
            lines = {w.key: list(self._view.get(w.key, ())) for w in waits}
            for w in waits:
                line = lines[w.key]
                where, h = placement(line, w)
                if where == "extend":
                    assert h is not None
                    line[-1] = replace(h, last_seq=w.seq)
                elif where == "append":
                    self._local -= 1  # below every store id: never confused with one
                    why = "" if line else reason[:REASON_CHARS]
                    at = datetime.now(UTC)
                    line.append(
                        Hold(
                            w.doc_id,
                            w.seq,
                            w.seq,
                            w.message_id,
                            w.incarnation,
                            self._local,
                            at,
                            why,
                        )
                    )
            return lines

    def _take(self, lines: Mapping[Key, list[Hold]]) -> None:
        """Take the store's answer for these keys into the view (an empty line: open)."""
        with self._cond:
            for k, line in lines.items():
                if line:
                    self._view[k] = line
                else:
                    self._view.pop(k, None)

    def _flush_local(self) -> None:
        """Write the holds this process kept only in its view (negative ids: the store failed
        when they were made) to the store, in their lines' order; raises the store's error when
        it still fails (each caller treats it as its own read or write failing). Without this,
        the first read after the store answered again replaced the view and forgot them, and a
        later document of the key went out ahead (a review found it)."""
        with self._cond:
            local = [(k, h) for k, line in self._view.items() for h in line if h.entry_id < 0]
        if not local:
            return
        waits: list[Wait] = []
        for k, h in local:
            for seq in dict.fromkeys((h.seq, h.last_seq)):
                waits.append(Wait(k, h.doc_id, h.incarnation, seq, h.message_id))
        reason = next((h.reason for _, h in local if h.reason), "")
        self._take(self.lines.hold(waits, reason or "held while the store failed", _now()))

    def _unavailable(self, what: str, error: Exception) -> None:
        """The store failed: this process keeps order with its own view until it answers again
        (a key it pauses meanwhile holds only its own sends), and says so once a minute."""
        now = time.monotonic()
        if now - self._warned < 60:
            return
        self._warned = now
        log.warning(
            "could not %s the paused ordering keys (%s); this process keeps its own view of "
            "them until the queue database answers",
            what,
            error,
        )

    # --- for people and the worker ------------------------------------------------------------

    def all_lines(self, limit: int | None = None) -> dict[Key, list[Hold]]:
        """Every paused key's line (the ``limit`` paused longest), from the store (the view
        takes them: a worker reads them with each batch, so what its rows show delivered
        passes those gates on)."""
        try:
            self._flush_local()
            lines = self.lines.lines(limit)
        except Exception as e:
            self._unavailable("read", e)
            with self._cond:
                return {k: list(v) for k, v in list(self._view.items())[:limit]}
        with self._cond:
            if limit is None:
                self._view = {k: list(v) for k, v in lines.items()}
            else:  # the rest of the view is read again with the dispatch that needs it
                self._view.update({k: list(v) for k, v in lines.items()})
        return lines

    def paused(self) -> dict[Key, Hold]:
        """Each paused key's gate."""
        return {k: line[0] for k, line in self.all_lines().items() if line}

    def held(self) -> dict[Key, list[Hold]]:
        """Each paused key's holds behind its gate, first in line first."""
        return {k: line[1:] for k, line in self.all_lines().items() if len(line) > 1}

    def gates(self, limit: int | None = None) -> set[str]:
        """The documents whose messages gate a key (of the ``limit`` keys paused longest): a
        worker reads and retries them with its batch, so a gate delivered elsewhere is seen and
        one not delivered yet is tried again."""
        return {line[0].doc_id for line in self.all_lines(limit).values() if line}

"""Per-key order in one dispatcher process: the line each ordering key's sends wait in, the keys
a failure paused, and the documents held behind them.

Why apart from the send loop (``dispatch``): this is the state the loop consults (is my turn?
is my key paused? who goes next?), under its own condition variable; the loop is the one place
that acts on it. docs/dispatcher.md, "Order per ordering key", states what holds.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from outbox.core.model import DocumentRow, OutboxMessage

log = logging.getLogger("outbox.dispatcher")

#: An ordering key as the broker sees it: (destination, session). Sessions are per entity.
Key = tuple[str, str]


def key_of(message: OutboxMessage, doc_id: str) -> Key:
    """The message's ordering key: its session (``ordering_key``, else the document id) on its
    destination."""
    return (message.destination, message.ordering_key or doc_id)


@dataclass(frozen=True, slots=True)
class Pause:
    """Why a key is paused: the first unsent message of that key (its document and seq)."""

    doc_id: str
    seq: int
    message_id: str
    incarnation: str | None = None  # the document's life the message belongs to


class KeyOrder:
    """One process's line per ordering key, its paused keys and the documents they hold back
    (thread safe).

    A paused key has a *gate*: the one message allowed through (with the earlier messages of its
    own document). Documents stopped behind the gate wait in the key's *held line*, in the order
    they were first held. When the gate's message is delivered, the gate passes to the first
    held document, so the held documents go out in the order they were committed, whichever of
    their retries reaches ``dispatch`` first (Pub/Sub's publisher has the same rule)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._lines: dict[Key, deque[int]] = {}
        self._paused: dict[Key, Pause] = {}
        self._held: dict[Key, list[Pause]] = {}

    def take(self, keys: set[Key]) -> int:
        """A ticket at the end of each key's line."""
        with self._cond:
            ticket = self._next
            self._next += 1
            for k in keys:
                self._lines.setdefault(k, deque()).append(ticket)
            return ticket

    def wait_turn(self, ticket: int, keys: Iterable[Key]) -> None:
        """Block until ``ticket`` is first in every one of ``keys``' lines."""
        wanted = set(keys)
        with self._cond:
            self._cond.wait_for(lambda: all(self._lines[k][0] == ticket for k in wanted))

    def release(self, ticket: int, keys: set[Key]) -> None:
        with self._cond:
            for k in keys:
                line = self._lines.get(k)
                if line is not None and ticket in line:
                    line.remove(ticket)
                    if not line:
                        del self._lines[k]
            self._cond.notify_all()

    def pause(self, key: Key, pause: Pause) -> None:
        """``pause``'s document stopped with ``pause`` as its first unsent message of ``key``.

        An open key is paused there. A key paused by another document (or another life of this
        one) holds this document in its line, once, at its first held message; a key already
        paused by this document keeps its gate."""
        with self._cond:
            gate = self._paused.get(key)
            if gate is None:
                self._paused[key] = pause
                log.warning(
                    "ordering key %s/%s paused at message %s (document %r seq %d): later messages "
                    "of this key wait until it is delivered",
                    key[0],
                    key[1],
                    pause.message_id,
                    pause.doc_id,
                    pause.seq,
                )
            elif not _same_life(gate, pause):
                held = self._held.setdefault(key, [])
                if not any(_same_life(h, pause) for h in held):
                    held.append(pause)

    def any_paused(self) -> bool:
        """Is any key paused? (When none is, a chunk skips the per-message check.)"""
        with self._cond:
            return bool(self._paused)

    def blocking(self, key: Key, message_id: str) -> Pause | None:
        """The pause that holds ``message_id`` back, or None (the paused message itself passes)."""
        with self._cond:
            p = self._paused.get(key)
        return None if p is None or p.message_id == message_id else p

    def delivered(self, message_ids: Iterable[str]) -> None:
        """Pass the gate on for every key whose gate message is among ``message_ids``."""
        with self._cond:
            if not self._paused:
                return
            ids = set(message_ids)
            for k, p in list(self._paused.items()):
                if p.message_id in ids:
                    self._advance(k, f"{p.message_id} was delivered", lambda h: h.message_id in ids)

    def seen(self, rows: Iterable[DocumentRow]) -> None:
        """Pass gates on whose message a row's watermark shows delivered (by anyone), and drop
        held documents delivered elsewhere."""
        with self._cond:
            if not self._paused:  # the usual case: no pass over the rows
                return
            marks = {r.id: (r.dispatched_seq, r.incarnation) for r in rows}

            def gone(p: Pause) -> bool:
                mark, life = marks.get(p.doc_id, (-1, p.incarnation))
                # delivered, or the document was deleted and created again: a message of its
                # old life will never be sent, and waiting for it would stop the key for good
                return mark >= p.seq or life != p.incarnation

            for k, p in list(self._paused.items()):
                held = self._held.get(k)
                if held:
                    held[:] = [h for h in held if not gone(h)]
                if gone(p):
                    self._advance(k, f"{p.message_id} was delivered", gone)

    def resume(self, key: Key) -> bool:
        """Give up on ``key``'s gate message (dead-lettered, say): the gate passes to the next
        held document, or the key opens. False if the key was not paused."""
        with self._cond:
            if key not in self._paused:
                return False
            self._advance(key, "resumed by hand", lambda h: False)
            return True

    def give_up(self, key: Key, gate: Pause) -> None:
        """Pass ``key``'s gate on if it is still ``gate`` (its message will never be sent)."""
        with self._cond:
            if self._paused.get(key) == gate:
                self._advance(key, f"{gate.message_id} belongs to an ended life", lambda h: False)

    def _advance(self, key: Key, why: str, done: Callable[[Pause], bool]) -> None:
        """The gate of ``key`` is through: the first held document not ``done`` becomes the gate;
        with none left, the key opens. Called with the condition held."""
        held = self._held.get(key, [])
        while held and done(held[0]):
            held.pop(0)
        if held:
            nxt = self._paused[key] = held.pop(0)
            log.info(
                "ordering key %s/%s: %s; the held document %r goes next (message %s)",
                *key,
                why,
                nxt.doc_id,
                nxt.message_id,
            )
        else:
            del self._paused[key]
            log.info("ordering key %s/%s resumed: %s", *key, why)
        if not held:
            self._held.pop(key, None)

    def paused(self) -> dict[Key, Pause]:
        with self._cond:
            return dict(self._paused)

    def held(self) -> dict[Key, list[Pause]]:
        """Each paused key's held documents, first in line first."""
        with self._cond:
            return {k: list(v) for k, v in self._held.items() if v}

    def gates(self) -> set[str]:
        """The documents whose messages gate a key: a worker reads their rows with its batch, so
        a gate delivered by another process is seen (``seen``) and does not hold the key here."""
        with self._cond:
            return {p.doc_id for p in self._paused.values()}


def _same_life(a: Pause, b: Pause) -> bool:
    return a.doc_id == b.doc_id and a.incarnation == b.incarnation

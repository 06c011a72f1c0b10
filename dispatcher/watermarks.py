"""The immediate dispatcher's watermarks, written off the caller's path and coalesced.

Why: after a commit, the sends take a few milliseconds, but the watermark is a Delta commit of
its own (a MERGE of 40-55 ms when this was measured; an append of mark rows since issue 31).
Written inline, it doubled a lone unit of work's cost and was a third of a batch's dispatch
(docs/performance-write-path.md). Here ``submit`` only records "the transport accepted document D
up to seq k" in memory; a background thread writes every recorded mark in **one**
``advance_watermarks`` commit once ``window`` seconds have passed since the first unwritten one
(or at once when ``max_documents`` are waiting, on ``flush`` and on ``close``).

The trade-off, precisely: a watermark only stops the rescuer (and commands) from sending a
message again. Marks are submitted strictly **after** the transport accepted the messages, so a
written watermark never covers an unsent message (no loss, I1). A mark not yet written when the
process dies is lost: those documents stay pending in Delta, and the rescuer re-sends their
messages after its delay with the **same message ids** (I6); the SQL queue's duplicate detection
(or the consumer's inbox) drops them. So a crash costs re-sends of at most ``window`` seconds'
worth of dispatches, never a loss or a reorder of first deliveries.

While a mark waits, this process does not re-send what it covers: ``covered`` tells the
dispatcher the highest seq accepted for a document's current incarnation. A mark carries the
incarnation it was sent for, and its mark row counts only for that incarnation, so a document
deleted and created again meanwhile (restarting at seq 1) is never marked as sent by its
predecessor's mark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from outbox.core.observers import NO_OBSERVER, Observer

log = logging.getLogger("outbox.dispatcher")

#: Seconds a mark may wait for others to share its commit (chosen by benchmarks/dispatch.py).
DEFAULT_WATERMARK_WINDOW = 0.2
#: Marks that make the writer go at once, whatever the window.
DEFAULT_MAX_DOCUMENTS = 50_000
#: Seconds before a failed write is tried again (the marks are kept, merged with newer ones).
RETRY_SECONDS = 1.0

#: (seq accepted by the transport, the document's incarnation)
Mark = tuple[int, str | None]


class _Life(Protocol):
    """A row as ``covered_rows`` reads it: its life."""

    @property
    def incarnation(self) -> str | None: ...


class MarkStore(Protocol):
    """The store's batched, monotonic watermark write, restricted to each mark's incarnation."""

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None: ...


class MarkBatch:
    """Marks taken for one write (the thread's own append, or riding along in a save's)."""

    __slots__ = ("generations", "marks")

    def __init__(self, marks: dict[str, Mark], generations: dict[str, int]) -> None:
        self.marks = marks
        self.generations = generations


class WatermarkWriter:
    """Coalesces watermark marks and writes them from one background thread (thread safe).

    Marks also ride along in the next save's append when the store takes them (``take`` /
    ``settle``, see ``DeltaDocumentStore.attach_watermarks``): a stream of units of work then pays
    no watermark commit at all, and the thread only writes what no save carried within the window.
    """

    def __init__(
        self,
        store: MarkStore,
        *,
        window: float = DEFAULT_WATERMARK_WINDOW,
        max_documents: int = DEFAULT_MAX_DOCUMENTS,
        observer: Observer = NO_OBSERVER,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.store = store
        self.window = window
        self.max_documents = max_documents
        self.observe = observer  # the runtime's: the write's span and counters
        self.retry_seconds = retry_seconds
        self._cond = threading.Condition()
        self._pending: dict[str, Mark] = {}
        self._generation: dict[str, int] = {}  # the submit that last raised each pending mark
        self._inflight: list[MarkBatch] = []  # taken, not yet written
        self._first_at: float | None = None
        self._not_before = 0.0
        self._submitted = 0  # generation of the last submit
        self._flush_to = 0
        self._failures = 0
        self._closing = False
        self._thread: threading.Thread | None = None
        self.last_error: Exception | None = None
        self.carried = 0  # documents whose mark rode along in a save

    # --- the dispatcher's side ----------------------------------------------------------------

    def submit(self, marks: Mapping[str, Mark]) -> None:
        """Record marks (after their messages were accepted); they are written later."""
        if not marks:
            return
        with self._cond:
            closed = self._closing
            if not closed:
                self._submit(marks)
        if closed:  # written inline, outside the lock (a save holding the store waits on it)
            self._write_now(dict(marks))

    def _submit(self, marks: Mapping[str, Mark]) -> None:
        """Record marks and wake the thread (called with the lock held). With nothing pending,
        the marks are taken whole (a copy in C, not a merge per document)."""
        self._submitted += 1
        if not self._pending:
            self._pending = dict(marks)
            self._generation = dict.fromkeys(marks, self._submitted)
        else:
            for doc_id, mark in marks.items():
                if _merge(self._pending, doc_id, mark):
                    self._generation[doc_id] = self._submitted
        if self._first_at is None:
            self._first_at = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outbox-watermarks", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def covered(self, docs: Iterable[tuple[str, str | None]]) -> dict[str, int]:
        """For (id, incarnation) pairs: the highest seq accepted for that life whose mark may not
        be written yet (only ids that have one)."""
        with self._cond:
            if not self._pending and not self._inflight:
                return {}
            out: dict[str, int] = {}
            held_maps = [self._pending] + [b.marks for b in self._inflight]
            for doc_id, incarnation in docs:
                for held_map in held_maps:
                    held = held_map.get(doc_id)
                    if held is not None and held[1] == incarnation:
                        out[doc_id] = max(out.get(doc_id, 0), held[0])
            return out

    def covered_rows(self, rows: Mapping[str, _Life]) -> dict[str, int]:
        """``covered`` for rows by document id: only the ids a held mark names are looked at
        (a set intersection), not every row of the dispatch."""
        with self._cond:
            if not self._pending and not self._inflight:
                return {}
            out: dict[str, int] = {}
            for held_map in [self._pending] + [b.marks for b in self._inflight]:
                for doc_id in held_map.keys() & rows.keys():
                    held = held_map[doc_id]
                    if held[1] == rows[doc_id].incarnation:
                        out[doc_id] = max(out.get(doc_id, 0), held[0])
            return out

    def pending(self) -> int:
        """Documents whose mark is not written yet."""
        with self._cond:
            return len(self._pending) + sum(len(b.marks) for b in self._inflight)

    def flush(self, timeout: float | None = None) -> bool:
        """Write every mark submitted so far; True once they are written. False when the write
        failed (the marks are kept and retried) or ``timeout`` passed."""
        with self._cond:
            target = self._submitted
            if not self._unwritten(target):
                return True
            failures = self._failures
            self._flush_to = max(self._flush_to, target)
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: not self._unwritten(target) or self._failures > failures, timeout
            )
            return not self._unwritten(target)

    def close(self) -> None:
        """Flush and stop the thread. A mark that cannot be written is logged and dropped: the
        rescuer re-sends its messages with the same ids."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join()

    def abandon(self) -> int:
        """Drop every unwritten mark and stop, as a crash would (tests, and a process that must
        exit at once). Returns how many documents were left unmarked."""
        with self._cond:
            dropped = len(self._pending)
            self._pending.clear()
            self._generation.clear()
            self._first_at = None
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        return dropped

    # --- taking marks for a write (the thread, or a save that carries them) ------------------

    def take(self, exclude: Iterable[str] = ()) -> MarkBatch | None:
        """Every pending mark but ``exclude``'s, for one write; ``settle`` must follow."""
        with self._cond:
            return self._take(set(exclude))

    def settle(
        self, batch: MarkBatch, error: BaseException | None, *, carried: bool = False
    ) -> None:
        """The write of ``batch`` happened (``error`` None) or not: then its marks wait again."""
        with self._cond:
            self._inflight.remove(batch)
            if error is None:
                if carried:
                    self.carried += len(batch.marks)
            else:
                for doc_id, mark in batch.marks.items():
                    _merge(self._pending, doc_id, mark)
                    first = batch.generations[doc_id]
                    self._generation[doc_id] = min(first, self._generation.get(doc_id, first))
                if self._first_at is None:
                    self._first_at = time.monotonic()
            self._cond.notify_all()

    def _take(self, exclude: set[str]) -> MarkBatch | None:
        if not self._pending:
            return None
        if exclude:
            marks = {d: m for d, m in self._pending.items() if d not in exclude}
            if not marks:
                return None
            for d in marks:
                del self._pending[d]
            batch = MarkBatch(marks, {d: self._generation.pop(d) for d in marks})
        else:  # all of them: the two dicts change hands whole
            batch = MarkBatch(self._pending, self._generation)
            self._pending, self._generation = {}, {}
        if not self._pending:
            self._first_at = None
        self._inflight.append(batch)
        return batch

    def _unwritten(self, target: int) -> bool:
        """Is a mark of a submit up to ``target`` still pending or in flight?"""
        if any(g <= target for g in self._generation.values()):
            return True
        return any(g <= target for b in self._inflight for g in b.generations.values())

    # --- the thread ---------------------------------------------------------------------------

    def _due(self) -> float | None:
        """Seconds until the pending marks should be written (0: now; None: nothing pending)."""
        if not self._pending:
            return None
        if self._closing or len(self._pending) >= self.max_documents:
            return 0.0
        now = time.monotonic()
        if self._flush_to:  # asked for: one attempt at once, whatever the backoff
            return 0.0
        assert self._first_at is not None
        return max(0.0, self._first_at + self.window - now, self._not_before - now)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    due = self._due()
                    if due is None and self._closing:
                        return
                    if due == 0.0:
                        break
                    self._cond.wait(due)
                batch = self._take(set())
                self._flush_to = 0  # this attempt answers every flush waiting so far
                closing = self._closing
            if batch is None:
                continue
            error = self._write(batch.marks)
            if error is not None and closing:
                log.warning(
                    "on close, the watermarks of %d document(s) were not written (%s); the "
                    "rescuer re-sends their messages with the same message ids",
                    len(batch.marks),
                    error,
                )
                error = None  # given up: nothing waits for them any more
            self.settle(batch, error)
            if error is not None:
                with self._cond:
                    self._not_before = time.monotonic() + self.retry_seconds
                    self._failures += 1
                    self._cond.notify_all()

    def _write_now(self, marks: dict[str, Mark]) -> None:
        """A submit after close: written by the caller, at once."""
        error = self._write(marks)
        if error is not None:
            log.warning("watermarks of %d document(s) were not written: %s", len(marks), error)

    def _write(self, marks: Mapping[str, Mark]) -> Exception | None:
        t0 = time.perf_counter()
        try:
            with self.observe.writing_watermark(len(marks)):
                self.store.advance_watermarks(
                    {d: m[0] for d, m in marks.items()}, {d: m[1] for d, m in marks.items()}
                )
        except Exception as e:
            self.last_error = e
            self.observe.watermark_failed()
            log.warning(
                "watermark for %d document(s) was not written (%s); kept for the next try",
                len(marks),
                e,
            )
            return e
        self.observe.watermark_written(time.perf_counter() - t0)
        return None


def _merge(into: dict[str, Mark], doc_id: str, mark: Mark) -> bool:
    """Keep the higher seq of one incarnation; another incarnation's mark replaces the held one
    (the later submitted is the newer life; one mark per document is all a write takes,
    and a dropped mark only means a re-send)."""
    held = into.get(doc_id)
    if held is None or held[1] != mark[1] or held[0] < mark[0]:
        into[doc_id] = mark
        return True
    return False

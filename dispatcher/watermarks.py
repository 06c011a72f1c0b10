"""The immediate dispatcher's watermarks, written off the caller's path and coalesced.

Why: after a commit, the sends take a few milliseconds, but the watermark MERGE is a Delta commit
of its own (40-55 ms). Written inline, it doubled a lone unit of work's cost and was a third of a
batch's dispatch (docs/performance-write-path.md). Here ``submit`` only records "the transport
accepted document D up to seq k" in memory; a background thread writes every recorded mark in
**one** ``advance_watermarks`` MERGE once ``window`` seconds have passed since the first
unwritten one (or at once when ``max_documents`` are waiting, on ``flush`` and on ``close``).

The trade-off, precisely: a watermark only stops the rescuer (and commands) from sending a
message again. Marks are submitted strictly **after** the transport accepted the messages, so a
written watermark never covers an unsent message (no loss, I1). A mark not yet written when the
process dies is lost: those documents stay pending in Delta, and the rescuer re-sends their
messages after its delay with the **same message ids** (I6); the SQL queue's duplicate detection
(or the consumer's inbox) drops them. So a crash costs re-sends of at most ``window`` seconds'
worth of dispatches, never a loss or a reorder of first deliveries.

While a mark waits, this process does not re-send what it covers: ``covered`` tells the
dispatcher the highest seq accepted for a document's current incarnation. A mark carries the
incarnation it was sent for, and the MERGE only applies it to that incarnation, so a document
deleted and created again meanwhile (restarting at seq 1) is never marked as sent by its
predecessor's mark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from dispatcher.metrics import DispatchMetrics
from outbox.core import telemetry

log = logging.getLogger("outbox.dispatcher")

#: Seconds a mark may wait for others to share its MERGE (chosen by benchmarks/dispatch.py).
DEFAULT_WATERMARK_WINDOW = 0.2
#: Marks that make the writer go at once, whatever the window.
DEFAULT_MAX_DOCUMENTS = 50_000
#: Seconds before a failed MERGE is tried again (the marks are kept, merged with newer ones).
RETRY_SECONDS = 1.0

#: (seq accepted by the transport, the document's incarnation)
Mark = tuple[int, str | None]


class MarkStore(Protocol):
    """The store's batched, monotonic watermark write, restricted to each mark's incarnation."""

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None: ...


class WatermarkWriter:
    """Coalesces watermark marks and writes them from one background thread (thread safe)."""

    def __init__(
        self,
        store: MarkStore,
        *,
        window: float = DEFAULT_WATERMARK_WINDOW,
        max_documents: int = DEFAULT_MAX_DOCUMENTS,
        metrics: DispatchMetrics | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.store = store
        self.window = window
        self.max_documents = max_documents
        self.metrics = metrics or DispatchMetrics()
        self.retry_seconds = retry_seconds
        self._cond = threading.Condition()
        self._pending: dict[str, Mark] = {}
        self._writing: dict[str, Mark] = {}  # taken by the thread, not yet written
        self._first_at: float | None = None
        self._not_before = 0.0
        self._submitted = 0  # generation of the last submit
        self._written = 0  # every submit up to this generation is written
        self._flush_to = 0
        self._failures = 0
        self._failures_since_flush = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.last_error: Exception | None = None

    # --- the dispatcher's side ----------------------------------------------------------------

    def submit(self, marks: Mapping[str, Mark]) -> None:
        """Record marks (after their messages were accepted); the thread writes them later."""
        if not marks:
            return
        with self._cond:
            if self._closing:  # closed: write inline, nothing may be left behind
                self._write_now(dict(marks))
                return
            for doc_id, mark in marks.items():
                _merge(self._pending, doc_id, mark)
            self._submitted += 1
            if self._first_at is None:
                self._first_at = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outbox-watermarks", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def covered(self, docs: Iterable[tuple[str, str | None]]) -> dict[str, int]:
        """For (id, incarnation) pairs: the highest seq accepted for that life whose mark may not
        be written yet (only ids that have one)."""
        with self._cond:
            if not self._pending and not self._writing:
                return {}
            out: dict[str, int] = {}
            for doc_id, incarnation in docs:
                for held in (self._writing.get(doc_id), self._pending.get(doc_id)):
                    if held is not None and held[1] == incarnation:
                        out[doc_id] = max(out.get(doc_id, 0), held[0])
            return out

    def pending(self) -> int:
        """Documents whose mark is not written yet."""
        with self._cond:
            return len(self._pending) + len(self._writing)

    def flush(self, timeout: float | None = None) -> bool:
        """Write every mark submitted so far; True once they are written. False when the write
        failed (they are kept and retried) or ``timeout`` passed."""
        with self._cond:
            target = self._submitted
            if self._written >= target:
                return True
            failures = self._failures
            self._flush_to = max(self._flush_to, target)
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._written >= target or self._failures > failures, timeout
            )
            return self._written >= target

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
            self._first_at = None
            self._written = self._submitted
            self._closing = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        return dropped

    # --- the thread ---------------------------------------------------------------------------

    def _due(self) -> float | None:
        """Seconds until the pending marks should be written (0: now; None: nothing pending)."""
        if not self._pending:
            return None
        if self._closing or len(self._pending) >= self.max_documents:
            return 0.0
        now = time.monotonic()
        if self._flush_to > self._written:
            return max(0.0, self._not_before - now) if self._failures_since_flush else 0.0
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
                marks, self._pending = self._pending, {}
                self._writing = marks
                generation = self._submitted
                self._first_at = None
                closing = self._closing
            error = self._write(marks)
            with self._cond:
                self._writing = {}
                if error is None:
                    self._written = max(self._written, generation)
                    self._failures_since_flush = False
                elif closing:
                    log.warning(
                        "on close, the watermarks of %d document(s) were not written (%s); the "
                        "rescuer re-sends their messages with the same message ids",
                        len(marks),
                        error,
                    )
                    self._written = max(self._written, generation)
                else:
                    for doc_id, mark in marks.items():
                        _merge(self._pending, doc_id, mark)
                    self._first_at = self._first_at or time.monotonic()
                    self._not_before = time.monotonic() + self.retry_seconds
                    self._failures += 1
                    self._failures_since_flush = True
                self._cond.notify_all()

    def _write_now(self, marks: dict[str, Mark]) -> None:
        """A submit after close: written by the caller, at once (called with the lock held)."""
        error = self._write(marks)
        if error is not None:
            log.warning("watermarks of %d document(s) were not written: %s", len(marks), error)

    def _write(self, marks: Mapping[str, Mark]) -> Exception | None:
        t0 = time.perf_counter()
        try:
            with telemetry.span("outbox.watermark", attributes={"outbox.documents": len(marks)}):
                self.store.advance_watermarks(
                    {d: m[0] for d, m in marks.items()}, {d: m[1] for d, m in marks.items()}
                )
        except Exception as e:
            self.last_error = e
            self.metrics.inc("watermark_failures")
            log.warning(
                "watermark for %d document(s) was not written (%s); kept for the next try",
                len(marks),
                e,
            )
            return e
        self.metrics.inc("watermark_merges")
        self.metrics.observe_watermark(time.perf_counter() - t0)
        return None


def _merge(into: dict[str, Mark], doc_id: str, mark: Mark) -> None:
    """Keep the higher seq of one incarnation; another incarnation's mark replaces the held one
    (the later submitted is the newer life; one source row per document is all a MERGE takes,
    and a dropped mark only means a re-send)."""
    held = into.get(doc_id)
    if held is None or held[1] != mark[1] or held[0] < mark[0]:
        into[doc_id] = mark

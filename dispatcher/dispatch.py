"""Sending a document's pending messages, in order, then recording that they left.

One ``Dispatcher.dispatch(rows)`` call is the whole job for a set of documents, whether the rows
come straight from a commit (immediate dispatch: they are in memory, nothing is re-read) or from
the store (the command worker):

1. Each document's pending messages (``dispatched_seq < seq <= last_seq``) are sent in seq order.
   A failed send stops that document's later messages (I2); other documents go on.
2. Documents run concurrently, at most ``max_in_flight`` sends at once. A document's messages are
   always sent by one thread, one batch after the other, so they never overtake each other.
3. Then **one** ``advance_watermarks`` MERGE records, for every document that made progress, the
   highest seq the transport accepted. It uses ``greatest(...)`` and no version check, so it never
   fails an application's concurrent save (I4).

Why first deliveries stay in seq order even when two senders race on one document (immediate
dispatch and a command worker, say): every sender starts right after the watermark it read, and
everything at or below a watermark was already accepted. So when a sender delivers seq k for the
first time, it has just delivered its own start..k-1, and everything below its start went earlier.

**Coalescing.** When the transport declares ``atomic_batches`` (the SQL queue: one transaction),
many documents' messages go out in one ``send`` of up to ``max_batch_messages`` messages. That
turns 1,000 round trips into two. If such a batch fails, nothing of it was accepted, and each of
its documents is retried on its own, so one poisoned document does not hold back the others.

**Per-key order (one process).** An ordering key (the session, per destination) may span
documents. ``KeyOrder`` serializes the sends of one key across documents in the order
``dispatch`` was called (each call takes a ticket per chunk under one lock, and a chunk waits
until it is first in line for every key it holds; chunks reach the pool in ticket order, so the
wait never deadlocks); within one call, documents go out by when their first pending message was
written. When a document stops with unsent messages (a failed send, or a paused key), every key
among them is **paused** at its first unsent message, the key's gate: later messages of that key,
from any document, are not sent (their documents stop there, wait in the key's held line and are
retried like a failed send), while other keys go on. When the gate's message is delivered (by
this dispatcher: a retry command or the rescuer's command runs the document again, and the gate
itself is let through; or by anyone else, seen as the document's watermark at or past it in a
later dispatch; or given up on with ``resume(key)``), the gate passes to the first held document,
so held documents leave in commit order whichever retry arrives first. Across processes nothing
of this holds: each process has its own line and pauses (docs/dispatcher.md, "Order per ordering
key").

Why one module: the key line wraps the same send loop it orders (a chunk waits its turn, sends,
pauses or resumes keys from the outcome); apart, the two would share every piece of state.

Nothing here raises ``Exception`` to the caller: failures are logged, counted and reported in the
``DispatchReport`` (the commit already happened; a command or the rescuer finishes the job).
``InjectedCrash`` (a ``BaseException``) passes through, standing for the process dying.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from dispatcher import hooks
from dispatcher.hooks import StepHook
from dispatcher.metrics import DispatchMetrics
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core import telemetry
from outbox.core.errors import PermanentTransportError, RetryableTransportError, ValidationError
from outbox.core.model import DocumentRow, OutboxMessage

if TYPE_CHECKING:
    from dispatcher.watermarks import WatermarkWriter

log = logging.getLogger("outbox.dispatcher")

#: One coalesced send's cap. 1,000, not 500: on SQLite one 1,000-message transaction took 32 ms
#: against 41 ms for two of 500, by hand (one fsync fewer; docs/performance-write-path.md).
DEFAULT_MAX_BATCH_MESSAGES = 1000

Plan = tuple[DocumentRow, list[OutboxMessage]]
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


class WatermarkStore(Protocol):
    """What the dispatcher needs from a document store: one batched, monotonic watermark write
    (with ``incarnations``, each mark applies only to the document's life it names)."""

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None: ...


def atomic_batches(transport: object) -> bool:
    """Does ``transport`` take a batch all-or-nothing, across sessions and destinations?

    A transport says so with an ``atomic_batches = True`` attribute (the SQL queue transport: one
    transaction per send); without it, batches are sent one document at a time.
    """
    return bool(getattr(transport, "atomic_batches", False))


def to_transport_message(message: OutboxMessage, doc_id: str) -> TransportMessage:
    """Map a stored message onto the transport's fields (Service Bus names in parentheses).

    The ordering key becomes the session (``session_id``); without one the document id is used,
    which gives per-document order. ``deliver_at`` becomes the scheduled time
    (``scheduled_enqueue_time_utc``), the message type the ``subject``.
    """
    return TransportMessage(
        message_id=message.message_id,
        destination=message.destination,
        body=message.body.encode("utf-8"),
        subject=message.type,
        content_type=message.content_type,
        session_id=message.ordering_key or doc_id,
        scheduled_at=message.deliver_at,
        correlation_id=message.correlation_id,
        headers=message.headers,  # shared, not copied: transports only read them (base.py)
    )


@dataclass(slots=True)  # not frozen, as TransportMessage: one per document dispatched
class DocumentOutcome:
    """What happened to one document's pending messages in one dispatch."""

    doc_id: str
    start_seq: int  # dispatched_seq when the dispatch began
    target_seq: int  # the highest pending seq it tried to send
    sent_up_to: int  # the highest seq the transport accepted (start_seq when none)
    error: Exception | None = None

    @property
    def complete(self) -> bool:
        return self.error is None and self.sent_up_to >= self.target_seq

    @property
    def progressed(self) -> bool:
        return self.sent_up_to > self.start_seq

    @property
    def permanent(self) -> bool:
        return isinstance(self.error, PermanentTransportError)


@dataclass
class DispatchReport:
    """The result of one dispatch: per-document outcomes and the watermark write."""

    outcomes: dict[str, DocumentOutcome] = field(default_factory=dict)
    messages_sent: int = 0
    watermark_version: int | None = None
    watermark_error: Exception | None = None
    watermark_seconds: float = 0.0
    #: The marks went to the ``WatermarkWriter`` (written later, off the caller's path).
    watermark_deferred: bool = False

    @property
    def failed(self) -> list[str]:
        """Documents that still hold unsent messages, or whose watermark was not written."""
        out = [d for d, o in self.outcomes.items() if not o.complete]
        if self.watermark_error is not None:
            out += [d for d, o in self.outcomes.items() if o.complete and o.progressed]
        return out

    @property
    def ok(self) -> bool:
        return not self.failed


class Dispatcher:
    """Sends pending messages for documents and advances their watermarks in one MERGE."""

    def __init__(
        self,
        store: WatermarkStore,
        transport: Transport,
        *,
        max_in_flight: int = 16,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
        coalesce: bool | None = None,
        metrics: DispatchMetrics | None = None,
        crash_points: StepHook | None = None,
        watermarks: WatermarkWriter | None = None,
    ) -> None:
        if max_in_flight < 1 or max_batch_messages < 1:
            raise ValidationError(
                f"max_in_flight ({max_in_flight!r}) and max_batch_messages "
                f"({max_batch_messages!r}) must be at least 1"
            )
        self.store = store
        self.transport = transport
        self.max_in_flight = max_in_flight
        self.max_batch_messages = max_batch_messages
        self.coalesce = atomic_batches(transport) if coalesce is None else coalesce
        self.metrics = metrics or DispatchMetrics()
        self.crash_points = crash_points or hooks.installed()
        #: Where ``dispatch(..., defer_watermark=True)`` puts its marks; also consulted so this
        #: process never re-sends what a not-yet-written mark covers.
        self.watermarks = watermarks
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.keys = KeyOrder()
        self._line_lock = threading.Lock()  # tickets are taken in the order chunks are submitted
        # Coalesced sends go one at a time. Why: an atomic batch is one database transaction, and
        # on SQLite one writer at a time; 200 batches on 16 threads spent their time convoying on
        # the write lock and the GIL (220 ms per 500-message send, against 38 ms sent one after
        # the other: the superlinear cost of a 100,000-document unit of work). The pool still
        # runs per-document sends concurrently (network transports).
        self._coalesced_slot = threading.Lock()
        self.one_batch_at_a_time = True  # False: the old behaviour, for the benchmark's "before"

    # --- the whole job ----------------------------------------------------------------------

    def dispatch(
        self,
        rows: Sequence[DocumentRow],
        *,
        started: float | None = None,
        defer_watermark: bool = False,
    ) -> DispatchReport:
        """Send what ``rows`` hold pending, then advance their watermarks in one MERGE.

        ``started`` is the ``time.perf_counter()`` of the commit, for commit-to-settled latency.
        With ``defer_watermark`` (and a ``watermarks`` writer), the marks are handed to the writer
        once the sends returned, and the MERGE happens later, coalesced with other dispatches'.
        """
        started = time.perf_counter() if started is None else started
        if not telemetry.tracing():  # nobody records the span: skip its pass over the messages
            return self._dispatch(rows, started, defer_watermark)
        pending = [  # unsorted: the attributes do not depend on the order
            m
            for r in rows
            if r.has_pending
            for m in r.outbox
            if r.dispatched_seq < m.seq <= r.last_seq
        ]
        parent, links = telemetry.batch_parent(m.headers for m in pending)
        attributes = {
            "messaging.system": type(self.transport).__name__,
            "messaging.destination.name": ",".join(sorted({m.destination for m in pending})),
            "messaging.batch.message_count": len(pending),
        }
        with telemetry.span("outbox.dispatch", parent=parent, links=links, attributes=attributes):
            return self._dispatch(rows, started, defer_watermark)

    def _dispatch(
        self, rows: Sequence[DocumentRow], started: float, defer_watermark: bool
    ) -> DispatchReport:
        report = self.send_pending(rows, started=started)
        self.crash_points.hit("after_send")
        if defer_watermark and self.watermarks is not None:
            self.defer(report, rows)
        else:
            self.advance(report, rows)
        return report

    def send_pending(
        self, rows: Sequence[DocumentRow], *, started: float | None = None
    ) -> DispatchReport:
        """Step 1 and 2 only: send, concurrently across documents, in order within each."""
        started = time.perf_counter() if started is None else started
        unique = {r.id: r for r in rows}  # a later row for the same id wins
        if self.watermarks is not None:  # accepted earlier, its mark not written yet: not again
            covered = self.watermarks.covered((r.id, r.incarnation) for r in unique.values())
            for doc_id, seq in covered.items():
                if seq > unique[doc_id].dispatched_seq:
                    unique[doc_id] = replace(unique[doc_id], dispatched_seq=seq)
        plans: list[Plan] = [
            (r, p) for r in unique.values() if r.has_pending and (p := r.pending())
        ]
        if len(plans) > 1:
            # One key's messages leave in the order they were written, whatever order the rows
            # came in (a worker's batch reads its documents in the store's order).
            plans.sort(key=_written_at)
        report = DispatchReport()
        self.keys.seen(unique.values())  # delivered elsewhere since it paused its key
        if not plans:
            return report
        chunks = self._chunks(plans)
        if len(chunks) == 1:
            keys = _keys(chunks[0])
            with self._line_lock:
                ticket = self.keys.take(keys)
            results = [self._run_in_line(chunks[0], started, ticket, keys)]
        else:
            results = self._run_concurrently(chunks, started)
        for outcomes in results:
            for o in outcomes:
                report.outcomes[o.doc_id] = o
                report.messages_sent += _count_sent(o, unique[o.doc_id])
        self.metrics.inc("messages_sent", report.messages_sent)
        self.metrics.inc("documents_dispatched", sum(o.complete for o in report.outcomes.values()))
        self.metrics.inc("documents_failed", sum(not o.complete for o in report.outcomes.values()))
        return report

    def defer(self, report: DispatchReport, rows: Sequence[DocumentRow]) -> None:
        """Step 3, later: hand the marks to the writer. Only ever after the sends returned, so a
        mark never covers a message the transport has not accepted."""
        assert self.watermarks is not None
        lives = {r.id: r.incarnation for r in rows}
        marks = {
            d: (o.sent_up_to, lives.get(d)) for d, o in report.outcomes.items() if o.progressed
        }
        if not marks:
            return
        self.crash_points.hit("during_watermark")  # dying here: sent, never marked
        self.watermarks.submit(marks)
        report.watermark_deferred = True

    def advance(self, report: DispatchReport, rows: Sequence[DocumentRow] = ()) -> None:
        """Step 3: one MERGE for every document that made progress; failures are recorded."""
        marks = {d: o.sent_up_to for d, o in report.outcomes.items() if o.progressed}
        if not marks:
            return
        lives = {r.id: r.incarnation for r in rows}
        self.crash_points.hit("during_watermark")
        t0 = time.perf_counter()
        try:
            with telemetry.span("outbox.watermark", attributes={"outbox.documents": len(marks)}):
                report.watermark_version = self.store.advance_watermarks(
                    marks, {d: lives[d] for d in marks} if lives.keys() >= marks.keys() else None
                )
        except Exception as e:
            report.watermark_error = e
            self.metrics.inc("watermark_failures")
            log.warning(
                "watermark for %d document(s) was not written (%s); their messages were sent and "
                "will be re-sent with the same message ids by a command or the rescuer",
                len(marks),
                e,
            )
        finally:
            report.watermark_seconds = time.perf_counter() - t0
        if report.watermark_error is None:
            self.metrics.inc("watermark_merges")
            self.metrics.observe_watermark(report.watermark_seconds)

    # --- sending ----------------------------------------------------------------------------

    def _chunks(self, plans: list[Plan]) -> list[list[Plan]]:
        """Whole documents grouped into sends of at most ``max_batch_messages`` (coalescing)."""
        if not self.coalesce:
            return [[p] for p in plans]
        chunks: list[list[Plan]] = []
        current: list[Plan] = []
        count = 0
        for plan in plans:
            n = len(plan[1])
            if current and count + n > self.max_batch_messages:
                chunks.append(current)
                current, count = [], 0
            current.append(plan)
            count += n
        if current:
            chunks.append(current)
        return chunks

    def _run_concurrently(
        self, chunks: list[list[Plan]], started: float
    ) -> list[list[DocumentOutcome]]:
        with self._pool_lock:  # application threads and worker threads share one dispatcher
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_in_flight, thread_name_prefix="outbox-send"
                )
            pool = self._pool
        # Tickets and submissions in one order: the pool starts tasks first in, first out, so a
        # task waiting for its turn only waits for tasks already running.
        lined: list[tuple[int, set[Key]]] = []
        futures: list[Future[list[DocumentOutcome]]] = []
        with self._line_lock:
            for c in chunks:
                keys = _keys(c)
                ticket = self.keys.take(keys)
                lined.append((ticket, keys))
                futures.append(pool.submit(self._run_in_line, c, started, ticket, keys))
        # On a crash, cancel what has not started and wait for every send already running, so
        # nothing is still in flight when the crash reaches the caller.
        wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            f.cancel()
        wait(futures)
        for f, (ticket, keys) in zip(futures, lined, strict=True):
            if f.cancelled():  # never ran: its place in line is given up
                self.keys.release(ticket, keys)
        for f in futures:
            error = None if f.cancelled() else f.exception()
            if error is not None:
                raise error
        return [f.result() for f in futures]

    def _run_in_line(
        self, chunk: list[Plan], started: float, ticket: int, keys: set[Key]
    ) -> list[DocumentOutcome]:
        """Send ``chunk`` once it is first in line for each of its keys."""
        try:
            self.keys.wait_turn(ticket, keys)
            if len(chunk) > 1 and self.one_batch_at_a_time:  # coalesced: see __init__
                with self._coalesced_slot:
                    return self._run_chunk(chunk, started)
            return self._run_chunk(chunk, started)
        finally:
            self.keys.release(ticket, keys)

    def _run_chunk(self, chunk: list[Plan], started: float) -> list[DocumentOutcome]:
        held_back = self.keys.any_paused() and any(
            self._held_back(row, m) is not None for row, msgs in chunk for m in msgs
        )
        if len(chunk) > 1 and not held_back:
            try:
                batch = [to_transport_message(m, row.id) for row, msgs in chunk for m in msgs]
                self._send(batch, started)
            except Exception as e:
                self.metrics.inc("coalesced_fallbacks")
                log.info(
                    "a batch of %d documents failed (%s); sending each on its own", len(chunk), e
                )
            else:
                self.keys.delivered(m.message_id for _, msgs in chunk for m in msgs)
                return [
                    DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, msgs[-1].seq)
                    for row, msgs in chunk
                ]
        return [self._send_document(row, msgs, started) for row, msgs in chunk]

    def _send_document(
        self, row: DocumentRow, msgs: list[OutboxMessage], started: float
    ) -> DocumentOutcome:
        """One document in seq order, ``max_batch_messages`` at a time; stop at a failure or at a
        message whose key is paused, and pause the keys of whatever is left unsent."""
        sent = row.dispatched_seq
        stop: Exception | None = None
        sendable = msgs
        for i, m in enumerate(msgs):
            pause = self._held_back(row, m)
            if pause is not None:
                sendable = msgs[:i]
                stop = RetryableTransportError(
                    f"document {row.id!r} seq {m.seq}: ordering key {m.ordering_key or row.id!r} "
                    f"is paused until message {pause.message_id} is delivered",
                    message_id=m.message_id,
                )
                self.metrics.inc("key_paused_stops")
                break
        for i in range(0, len(sendable), self.max_batch_messages):
            part = sendable[i : i + self.max_batch_messages]
            try:
                self._send([to_transport_message(m, row.id) for m in part], started)
            except Exception as e:
                self.metrics.inc("send_failures")
                log.warning(
                    "document %r: send of seq %d..%d failed (%s); its later messages wait for a "
                    "retry",
                    row.id,
                    part[0].seq,
                    msgs[-1].seq,
                    e,
                )
                stop = e
                break
            self.keys.delivered(m.message_id for m in part)
            sent = part[-1].seq
        if stop is None:
            return DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, sent)
        for m in msgs:  # every key with an unsent message waits for its first unsent one
            if m.seq > sent:
                self.keys.pause(
                    key_of(m, row.id), Pause(row.id, m.seq, m.message_id, row.incarnation)
                )
        return DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, sent, stop)

    def _held_back(self, row: DocumentRow, m: OutboxMessage) -> Pause | None:
        """The pause that holds ``m`` back: none when its key's paused message is ``m`` or an
        earlier message of the same document (sent first in this run, or the run stops there)."""
        key = key_of(m, row.id)
        pause = self.keys.blocking(key, m.message_id)
        while pause is not None and pause.doc_id == row.id:
            if pause.incarnation == row.incarnation:
                return None if pause.seq < m.seq else pause
            # The document was deleted and created again since it paused the key: its old
            # life's message will never be delivered (found by the checker's seed 23: the
            # re-created document's commands were dead-lettered behind that pause). The gate
            # passes on, maybe to a document held before this one.
            self.keys.give_up(key, pause)
            pause = self.keys.blocking(key, m.message_id)
        return pause

    def _send(self, batch: list[TransportMessage], started: float) -> None:
        self.metrics.inc("send_calls")
        self.transport.send(batch)
        self.metrics.observe_settle(time.perf_counter() - started, len(batch))
        self.crash_points.hit("mid_batch")

    def forget_gates(self, doc_ids: Iterable[str]) -> None:
        """The documents ``doc_ids`` are gone (deleted): a key they gate passes on, since their
        messages will never be sent."""
        ids = set(doc_ids)
        for key, gate in self.keys.paused().items():
            if gate.doc_id in ids:
                self.keys.give_up(key, gate)

    def resume(self, destination: str, ordering_key: str) -> bool:
        """Resume a paused key by hand (its paused message was given up on: dead-lettered,
        say). Returns False when the key was not paused."""
        return self.keys.resume((destination, ordering_key))

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _written_at(plan: Plan) -> float:
    """When the first pending message of a plan was written (``created_at``; 0 when unknown, so
    such plans keep their order, the sort being stable)."""
    at = plan[1][0].created_at
    return 0.0 if at is None else at.timestamp()


def _keys(chunk: list[Plan]) -> set[Key]:
    return {key_of(m, row.id) for row, msgs in chunk for m in msgs}


def _count_sent(outcome: DocumentOutcome, row: DocumentRow) -> int:
    low, high = outcome.start_seq, outcome.sent_up_to
    if high <= low:
        return 0
    if len(row.outbox) == 1:  # the usual case: one message per document
        return int(low < row.outbox[0].seq <= high)
    return sum(1 for m in row.outbox if low < m.seq <= high)

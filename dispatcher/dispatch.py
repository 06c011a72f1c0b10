"""Sending a document's pending messages, in order, then recording that they left.

One ``Dispatcher.dispatch(rows)`` call is the whole job for a set of documents, whether the rows
come straight from a commit (immediate dispatch: they are in memory, nothing is re-read) or from
the store (the command worker):

1. Each document's pending messages (``dispatched_seq < seq <= last_seq``) are sent in seq order.
   A failed send stops that document's later messages (I2); other documents go on.
2. Documents run concurrently, at most ``max_in_flight`` sends at once. A document's messages are
   always sent by one thread, one batch after the other, so they never overtake each other.
3. Then **one** ``advance_watermarks`` commit records, for every document that made progress, the
   highest seq the transport accepted. It uses ``greatest(...)`` and no version check, so it never
   fails an application's concurrent save (I4).

Why first deliveries stay in seq order even when two senders race on one document (immediate
dispatch and a command worker, say): every sender starts right after the watermark it read, and
everything at or below a watermark was already accepted. So when a sender delivers seq k for the
first time, it has just delivered its own start..k-1, and everything below its start went earlier.

**Coalescing.** When the transport declares ``atomic_batches`` (the SQL queue: one transaction),
many documents' messages go out in one ``send`` of up to ``max_batch_messages`` messages. That
turns 1,000 round trips into two. If such a batch fails, nothing of it was accepted, and each of
its documents is retried on its own, so one poisoned document does not hold back the others. A
transport that pipelines but is not atomic (Kafka) declares ``coalesce_sends`` instead: a failed
batch may have had a prefix accepted, and the per-document retries send it again with the same
ids (repeats, which the consumers' inboxes drop, as after any failed send; never a loss).

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
so held documents leave in commit order whichever retry arrives first. The paused keys and their
lines live in a ``KeyLines`` store: in the queue's database they hold for every process that
shares it (the writer, ``run-dispatcher``'s worker, the Spark executors); in memory, for this
process only (docs/dispatcher.md, "Order per ordering key").

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
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING

from dispatcher.keys import Key, KeyOrder, key_of
from dispatcher.outcomes import DispatchReport, DocumentOutcome, Plan
from dispatcher.queue.key_lines import KeyLines, Wait
from dispatcher.sending import (
    Outage,
    atomic_batches,
    chunked,
    coalesces,
    keys_of,
    pending_plans,
    shared,
    to_transport_message,
    transport_messages,
    written_at,
)
from dispatcher.transports.base import Transport, TransportMessage
from dispatcher.watermarks import MarkStore
from outbox.core.errors import (
    RetryableTransportError,
    TransportUnavailableError,
    ValidationError,
)
from outbox.core.model import DocumentRow, OutboxMessage
from outbox.core.observers import NO_OBSERVER, Observer

if TYPE_CHECKING:
    from dispatcher.watermarks import WatermarkWriter

__all__ = [  # and what moved out of this module, where it was imported from before
    "DEFAULT_MAX_BATCH_MESSAGES",
    "DispatchReport",
    "Dispatcher",
    "DocumentOutcome",
    "KeyPausedError",
    "atomic_batches",
    "coalesces",
    "to_transport_message",
]

log = logging.getLogger("outbox.dispatcher")

#: One coalesced send's cap. 1,000, not 500: on SQLite one 1,000-message transaction took 32 ms
#: against 41 ms for two of 500, by hand (one fsync fewer; docs/performance-write-path.md).
DEFAULT_MAX_BATCH_MESSAGES = 1000

#: Rounds one dispatch gives the documents a key's line held back while it passed gates.
PAUSED_ROUNDS = 8


class KeyPausedError(RetryableTransportError):
    """A document stopped at a message its key's line holds back (a gate not delivered yet)."""


class Dispatcher:
    """Sends pending messages for documents and advances their watermarks in one commit."""

    def __init__(
        self,
        store: MarkStore,
        transport: Transport,
        *,
        max_in_flight: int = 16,
        max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES,
        coalesce: bool | None = None,
        observer: Observer = NO_OBSERVER,
        watermarks: WatermarkWriter | None = None,
        key_lines: KeyLines | None = None,
    ) -> None:
        """``observer`` watches the steps (metrics, spans, crash points: ``Observers`` of them,
        built by the runtime); a dispatcher built without one watches nothing. ``key_lines``
        holds the paused keys' lines (default: this process's own, in memory; the runtime
        passes the queue database's beside a server transport, so every process shares them)."""
        if max_in_flight < 1 or max_batch_messages < 1:
            raise ValidationError(
                f"max_in_flight ({max_in_flight!r}) and max_batch_messages "
                f"({max_batch_messages!r}) must be at least 1"
            )
        self.store = store
        self.transport = transport
        self.max_in_flight = max_in_flight
        self.max_batch_messages = max_batch_messages
        self.coalesce = coalesces(transport) if coalesce is None else coalesce
        self.atomic = atomic_batches(transport)
        self.observe = observer
        self._system = type(transport).__name__
        #: Where ``dispatch(..., defer_watermark=True)`` puts its marks; also consulted so this
        #: process never re-sends what a not-yet-written mark covers.
        self.watermarks = watermarks
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.keys = KeyOrder(key_lines)
        self._line_lock = threading.Lock()  # tickets are taken in the order chunks are submitted
        # Atomic coalesced sends go one at a time. Why: an atomic batch is one database
        # transaction, and on SQLite one writer at a time; 200 batches on 16 threads spent their
        # time convoying on the write lock and the GIL (220 ms per 500-message send, against 38 ms
        # sent one after the other: the superlinear cost of a 100,000-document unit of work).
        # The pool still runs per-document sends concurrently (network transports), and the
        # shared sends of a transport that is not atomic (Kafka) overlap. Not smaller ones to
        # overlap more: a 1,000-document dispatch to Kafka split into four sends of 250 in
        # flight together took 24.9 ms against 15.7 ms as one send (benchmarks/results/
        # kafka_before_one_send.json and kafka_before_plan_lists.json, outbox_ms).
        self._coalesced_slot = threading.Lock()

    # --- the whole job ----------------------------------------------------------------------

    def dispatch(
        self,
        rows: Sequence[DocumentRow],
        *,
        started: float | None = None,
        defer_watermark: bool = False,
    ) -> DispatchReport:
        """Send what ``rows`` hold pending, then advance their watermarks in one commit.

        ``started`` is the ``time.perf_counter()`` of the commit, for commit-to-settled latency.
        With ``defer_watermark`` (and a ``watermarks`` writer), the marks are handed to the writer
        once the sends returned, and the write happens later, coalesced with other dispatches'.
        """
        started = time.perf_counter() if started is None else started
        with self.observe.dispatching(rows, self._system):
            report = self.send_pending(rows, started=started)
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
            for doc_id, seq in self.watermarks.covered_rows(unique).items():
                if seq > unique[doc_id].dispatched_seq:
                    unique[doc_id] = replace(unique[doc_id], dispatched_seq=seq)
        plans = pending_plans(unique.values())
        report = DispatchReport()
        if not plans:
            self.keys.seen(unique.values())  # delivered elsewhere: a gate may pass
            self.observe.sends_done(0, 0, 0)
            return report
        # every key once: its own document's (the usual case), or a session that may span
        # documents; only then does the order between documents matter
        keys = keys_of(plans)
        if len(plans) > 1 and shared(plans):
            # One key's messages leave in the order they were written, whatever order the rows
            # came in (a worker's batch reads its documents in the store's order).
            plans.sort(key=written_at)
        # the paused keys' lines as the store has them now (other processes pause and pass
        # gates too), then what the rows show delivered since
        self.keys.refresh(keys)
        self.keys.seen(unique.values())
        outage = Outage()
        for _ in range(PAUSED_ROUNDS):
            for chunk, outcomes in self._run(plans, keys, started, outage):
                if outcomes is None:
                    report.sent_whole(chunk)
                    continue
                for o in outcomes:
                    report.record(o, unique[o.doc_id])
            # A document held behind a gate this dispatch passed (the gate's document came after
            # it here: rows written in one instant) goes again, from where it stopped.
            plans = self._passed_by(plans, report)
            if not plans:
                break
            keys = keys_of(plans)
        complete, failed = report.tally()
        self.observe.sends_done(report.messages_sent, complete, failed)
        return report

    def _run(
        self, plans: list[Plan], keys: set[Key], started: float, outage: Outage
    ) -> list[tuple[list[Plan], list[DocumentOutcome] | None]]:
        """Each chunk with its outcomes (None: its one send took every message)."""
        chunks = self._chunks(plans)
        if len(chunks) == 1:  # on the caller's thread, with the keys already gathered
            with self._line_lock:
                ticket = self.keys.take(keys)
            return [(plans, self._run_in_line(plans, started, ticket, outage))]
        return self._run_concurrently(chunks, started, outage)

    def _passed_by(self, plans: list[Plan], report: DispatchReport) -> list[Plan]:
        """The documents of ``plans`` held back by a key's line that may go now, as plans from
        where they stopped; none unless something was delivered meanwhile."""
        if not report.messages_sent or not self.keys.any_paused():
            return []
        again: list[Plan] = []
        for row, msgs in plans:
            o = report.outcomes[row.id]
            if not isinstance(o.error, KeyPausedError):
                continue
            rest = [m for m in msgs if m.seq > o.sent_up_to]
            m = rest[0]
            if self.keys.blocking(key_of(m, row.id), row, m.seq) is None:
                again.append((replace(row, dispatched_seq=o.sent_up_to), rest))
        return again

    def defer(self, report: DispatchReport, rows: Sequence[DocumentRow]) -> None:
        """Step 3, later: hand the marks to the writer. Only ever after the sends returned, so a
        mark never covers a message the transport has not accepted."""
        assert self.watermarks is not None
        marks = report.marks(rows)
        if not marks:
            return
        self.observe.watermark_due()  # dying here: sent, never marked
        self.watermarks.submit(marks)
        report.watermark_deferred = True

    def advance(self, report: DispatchReport, rows: Sequence[DocumentRow] = ()) -> None:
        """Step 3: one commit for every document that made progress; failures are recorded."""
        marks = {d: o.sent_up_to for d, o in report.outcomes.items() if o.progressed}
        if not marks:
            return
        lives = {r.id: r.incarnation for r in rows}
        known = lives.keys() >= marks.keys()
        self.observe.watermark_due()
        t0 = time.perf_counter()
        try:
            with self.observe.writing_watermark(len(marks)):
                report.watermark_version = self.store.advance_watermarks(
                    marks, {d: lives[d] for d in marks} if known else None
                )
        except Exception as e:
            report.watermark_error = e
            self.observe.watermark_failed()
            log.warning(
                "watermark for %d document(s) was not written (%s); their messages were sent and "
                "will be re-sent with the same message ids by a command or the rescuer",
                len(marks),
                e,
            )
        finally:
            report.watermark_seconds = time.perf_counter() - t0
        if report.watermark_error is None:
            self.observe.watermark_written(report.watermark_seconds)

    # --- sending ----------------------------------------------------------------------------

    def _chunks(self, plans: list[Plan]) -> list[list[Plan]]:
        """Whole documents grouped into sends of at most ``max_batch_messages`` (coalescing)."""
        if not self.coalesce:
            return [[p] for p in plans]
        limit = self.max_batch_messages
        if len(plans) == 1 or sum([len(msgs) for _, msgs in plans]) <= limit:
            return [plans]  # one send, the usual case
        return chunked(plans, limit)

    def _run_concurrently(
        self, chunks: list[list[Plan]], started: float, outage: Outage
    ) -> list[tuple[list[Plan], list[DocumentOutcome] | None]]:
        with self._pool_lock:  # application threads and worker threads share one dispatcher
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_in_flight, thread_name_prefix="outbox-send"
                )
            pool = self._pool
        # Tickets and submissions in one order: the pool starts tasks first in, first out, so a
        # task waiting for its turn only waits for tasks already running.
        tickets: list[int] = []
        futures: list[Future[list[DocumentOutcome] | None]] = []
        with self._line_lock:
            for c in chunks:
                ticket = self.keys.take(keys_of(c))
                tickets.append(ticket)
                futures.append(pool.submit(self._run_in_line, c, started, ticket, outage))
        # On a crash, cancel what has not started and wait for every send already running, so
        # nothing is still in flight when the crash reaches the caller.
        wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            f.cancel()
        wait(futures)
        for f, ticket in zip(futures, tickets, strict=True):
            if f.cancelled():  # never ran: its place in line is given up
                self.keys.release(ticket)
        for f in futures:
            error = None if f.cancelled() else f.exception()
            if error is not None:
                raise error
        return [(c, f.result()) for c, f in zip(chunks, futures, strict=True)]

    def _run_in_line(
        self, chunk: list[Plan], started: float, ticket: int, outage: Outage
    ) -> list[DocumentOutcome] | None:
        """Send ``chunk`` once it is first in line for each of its keys."""
        try:
            self.keys.wait_turn(ticket)
            if self.atomic and len(chunk) > 1:  # atomic coalesced: one at a time (see __init__)
                with self._coalesced_slot:
                    return self._run_chunk(chunk, started, outage)
            return self._run_chunk(chunk, started, outage)
        finally:
            self.keys.release(ticket)

    def _run_chunk(
        self, chunk: list[Plan], started: float, outage: Outage
    ) -> list[DocumentOutcome] | None:
        """Send ``chunk``: None when one send took every message of it, else an outcome per
        document."""
        held_back = self.keys.any_paused() and any(
            self.keys.blocking(key_of(m, row.id), row, m.seq) is not None
            for row, msgs in chunk
            for m in msgs
        )
        if len(chunk) > 1 and not held_back:
            batch = transport_messages(chunk)
            try:
                self._send(batch, started, outage)
            except Exception as e:
                self.observe.batch_fell_back()
                if isinstance(e, TransportUnavailableError):
                    # Nothing of it was taken, and the broker said try later: sending each
                    # document on its own would wait out one timeout each (a 10-document unit
                    # of work blocked (10 + 1) x kafka_send_timeout). They wait for a retry.
                    log.info("a batch of %d documents failed (%s); retried later", len(chunk), e)
                    return self._stop_all(chunk, e)
                log.info(
                    "a batch of %d documents failed (%s); sending each on its own", len(chunk), e
                )
            else:
                if self.keys.any_paused():  # once per send: the usual view is empty
                    for row, msgs in chunk:
                        self.keys.delivered(row, msgs[-1].seq, {key_of(m, row.id) for m in msgs})
                return None
        return [self._send_document(row, msgs, started, outage) for row, msgs in chunk]

    def _stop_all(self, chunk: list[Plan], error: Exception) -> list[DocumentOutcome]:
        waits = [
            Wait(key_of(m, row.id), row.id, row.incarnation, m.seq, m.message_id)
            for row, msgs in chunk
            for m in msgs
        ]
        self.keys.hold(waits, str(error))
        return [
            DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, row.dispatched_seq, error)
            for row, msgs in chunk
        ]

    def _send_document(
        self, row: DocumentRow, msgs: list[OutboxMessage], started: float, outage: Outage
    ) -> DocumentOutcome:
        """One document in seq order, ``max_batch_messages`` at a time; stop at a failure or at a
        message its key's line holds back, and put whatever is left unsent in its keys' lines.

        The line is asked again after each part: delivering this document's gate may pass the
        key to a later run of its own messages (or hold them behind another document's)."""
        sent = row.dispatched_seq
        stop: Exception | None = None
        i = 0
        while i < len(msgs) and stop is None:
            j, gate = i, None
            while j < len(msgs) and j - i < self.max_batch_messages:
                m = msgs[j]
                gate = self.keys.blocking(key_of(m, row.id), row, m.seq)
                if gate is not None:
                    break
                j += 1
            if j > i:
                part = msgs[i:j]
                try:
                    self._send([to_transport_message(m, row.id) for m in part], started, outage)
                except Exception as e:
                    self.observe.send_failed()
                    log.warning(
                        "document %r: send of seq %d..%d failed (%s); its later messages wait "
                        "for a retry",
                        row.id,
                        part[0].seq,
                        msgs[-1].seq,
                        e,
                    )
                    stop = e
                    break
                sent = part[-1].seq
                self._delivered(row, sent, part)
                i = j
                continue
            assert gate is not None
            m = msgs[i]
            stop = KeyPausedError(
                f"document {row.id!r} seq {m.seq}: ordering key {m.ordering_key or row.id!r} "
                f"is paused until message {gate.message_id} is delivered",
                message_id=m.message_id,
            )
            self.observe.key_paused()
        if stop is None:
            return DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, sent)
        # every key with an unsent message waits: a paused key's line takes the message where
        # it belongs, an open key is paused at its first unsent one
        self.keys.hold(
            [
                Wait(key_of(m, row.id), row.id, row.incarnation, m.seq, m.message_id)
                for m in msgs
                if m.seq > sent
            ],
            str(stop),
        )
        return DocumentOutcome(row.id, row.dispatched_seq, msgs[-1].seq, sent, stop)

    def _delivered(self, row: DocumentRow, up_to: int, msgs: list[OutboxMessage]) -> None:
        if self.keys.any_paused():
            self.keys.delivered(row, up_to, {key_of(m, row.id) for m in msgs})

    def _send(self, batch: list[TransportMessage], started: float, outage: Outage) -> None:
        outage.check(batch)
        try:
            self.transport.send(batch)
        except TransportUnavailableError as e:
            outage.failed(batch, e)
            raise
        self.observe.sent(len(batch), time.perf_counter() - started)

    def forget_gates(self, doc_ids: Iterable[str]) -> None:
        """The documents ``doc_ids`` are gone (deleted): a key they gate passes on, since their
        messages will never be sent."""
        self.keys.forget(set(doc_ids))

    def resume(self, destination: str, ordering_key: str, message_id: str | None = None) -> bool:
        """Resume a paused key by hand: give up on its gate when the gate is ``message_id`` (a
        dead-lettered command's message, say; the next held document goes next), or, without
        one, open the key. Idempotent: False when there was nothing to do."""
        return self.keys.resume((destination, ordering_key), message_id)

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

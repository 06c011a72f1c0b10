"""A consumer that runs a handler per message and settles by outcome.

* success -> complete (in batches, after the handler: ``completer``); an exception -> abandon
  with exponential backoff; a declared permanent
  error -> dead-letter (the handler said retrying cannot help); ``DeferMessage`` raised or
  returned -> defer (set aside; ``queue.receive_deferred`` brings it back by sequence number).
* A background thread renews the locks of every message held: running, waiting for a thread,
  received ahead, or handled and waiting for its completion; so a long handler keeps its message.
* Completion in batches (no inbox, no claim log, a handler without a ``Connection``): a handled
  message waits, still locked, for the next flush of ``complete_batch`` messages, flushed when
  the batch is full, when the oldest has waited ``complete_delay`` seconds, and whenever the
  loop has nothing more in hand (``run_once`` flushes before it returns). One statement per
  flush. At most ``complete_batch`` messages are handled but not completed at any time, so a
  process that dies repeats at most that many (at-least-once: never completed before the
  handler returned). ``complete_batch=1`` completes each message as its handler returns.
* Receives grow (``run_forever``, ``max_messages`` not named): from ``max(concurrency, 16)``,
  doubled after a full receive whose batch was handled within 0.1 s, up to 100; back after a
  short receive or a slow batch (``receive_size`` says why).
* Prefetch (``run_forever`` with ``concurrency`` > 1): the next batch is received while this
  one's handlers run; its locks are renewed, and ``stop()`` abandons it.
* Order within a session holds because the queue only hands out a session's head, and a message
  waiting for its completion is still in its session's line.
* Inbox (optional): each message id is *claimed* in the inbox before its handler runs (see
  ``inbox``): an id already handled is completed without running the handler; an id another
  delivery is handling now (its claim's lease is live) is abandoned until that lease ends and
  looked at again, never dropped (the holder may crash); a claim whose lease ended (a crashed or
  hung handler) is taken over. ``inbox=True`` (or a consumer name) is the SQL inbox
  (``inbox.SqlInbox``); any ``inbox.Inbox`` may be passed instead (``inbox_cosmos.CosmosInbox``).
  The lease (``inbox_lease``) defaults to the queue's lock duration, is renewed while the handler
  runs, and is released when the handler fails. Ids handled longer ago than ``inbox_retention``
  are pruned by the consumer itself, at most hourly (``inbox_pruning``). The guarantee per
  mode:
  - a handler that takes a ``Connection``, with the SQL inbox: claim, the handler's SQL work, the
    record and the completion commit in ONE transaction: either all happen or none do
    (exactly-once effect in this database; a concurrent duplicate waits for that transaction).
    Another inbox is refused with ``ConfigurationError``. That transaction is the queue's write
    transaction (on SQLite: the process's single writer, under BEGIN IMMEDIATE), so inside such
    a handler send through the given connection, ``queue.send(name, message, conn=conn)``; the
    messages then commit or roll back with the handler's work. A queue call that opens its own
    write transaction (``send`` without ``conn``, ``complete``, ``abandon``...) from inside the
    handler raises ``QueueError`` instead of deadlocking.
  - any other handler or inbox: claim, handler, then record and complete (one transaction with
    the SQL inbox in the queue's database; two steps otherwise). At most one handler runs at a
    time per message id per consumer name; it runs again only after a failure, or a crash or
    hang that outlived the lease. At-least-once with no concurrent duplicates: a crash before
    the record runs the handler again, one after it is dropped by the inbox; never a loss.
* Claims (optional, two regions): ``claims=<ClaimLog>`` runs the claim-log receive protocol of
  ``claimed.ClaimedReceive`` (each message handled once across both regions' copies, in session
  order; ``granularity`` a ``claimed.Granularity``, "message" or "session"; the claim's lease
  renewed while the handler runs). It needs a handler without a ``Connection`` and no inbox (the
  claim log deduplicates).
* ``stop()`` (or SIGTERM/SIGINT under ``run_forever``) stops receiving, lets running handlers
  finish and abandons messages it received but did not start, so their locks are released at once.

Why one module: a message's way through the consumer (plain, claimed in an inbox, or claimed in
the claim log) shares the settlement helpers and the mapping of a handler's outcome to a
settlement; apart, each would restate them. What is not about settling is elsewhere: a
``Connection`` handler's one transaction in ``in_transaction`` and a message with an inbox in
``with_inbox`` (both are handed these helpers), the inbox's storage and claim renewal in
``inbox``, the two-region claim-log protocol in ``claimed``, the lock renewal in
``lock_renewer`` (all three on ``renewal.LeaseRenewer``), the batch completion in ``completer``,
the completion inside a transaction in ``receiver`` (``complete_in``), the receives' size in
``receive_size``, the knobs above in ``consumer_options`` (``ConsumerOptions``, or each as a
keyword, and what the inbox and claim-log options build).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import replace
from datetime import timedelta
from typing import Any, Unpack

from opentelemetry.trace import SpanKind
from sqlalchemy import Connection

from dispatcher.queue import validation
from dispatcher.queue.claimed import default_owner
from dispatcher.queue.completer import Completer
from dispatcher.queue.consumer_options import (
    DEFAULT_BACKOFF,
    ConsumerKeywords,
    ConsumerOptions,
    claimed_receive,
    inbox_of,
)
from dispatcher.queue.in_transaction import run_in_transaction, takes_connection
from dispatcher.queue.inbox import ClaimKeeper, InboxClaim, TransactionalInbox
from dispatcher.queue.inbox_pruning import InboxPruner
from dispatcher.queue.lock_renewer import LockRenewer, Unsettled
from dispatcher.queue.messages import DeferMessage, ReceivedMessage
from dispatcher.queue.receive_size import ReceiveSize
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.queue.with_inbox import run_with_inbox
from outbox.core import telemetry
from outbox.core.errors import ConfigurationError, LockLostError
from outbox.core.runloop import RunLoop

__all__ = ["DEFAULT_BACKOFF", "DEFAULT_MAX_MESSAGES", "Consumer", "ConsumerOptions", "Handler"]

log = logging.getLogger("outbox.queue.consumer")

Handler = Callable[[ReceivedMessage], Any] | Callable[[ReceivedMessage, Connection], Any]

#: ``run_once``'s batch when no one names one (``concurrency`` when larger): one receive per batch;
#: ``run_forever``'s first, from which its receives grow while the queue is deep and the handlers
#: quick (``receive_size``).
DEFAULT_MAX_MESSAGES = 16


class Consumer:
    """Receives from ``queue_name`` in batches of up to ``max_messages``; runs ``handler`` on up
    to ``concurrency`` messages at once."""

    def __init__(
        self,
        queue: SqlQueue,
        queue_name: str,
        handler: Handler,
        *,
        options: ConsumerOptions | None = None,
        **keywords: Unpack[ConsumerKeywords],
    ) -> None:
        """``options`` (``ConsumerOptions``), and any of its fields as a keyword over it."""
        opts = self.options = replace(options or ConsumerOptions(), **keywords)
        self.queue = queue
        self.queue_name = validation.queue_name(queue_name)
        self.handler = handler
        self.clock = opts.clock or queue.clock
        self.inbox = inbox_of(opts.inbox, queue, queue_name)
        #: the SQL inbox in the queue's own database: its steps join the queue's transactions
        self._joined: TransactionalInbox | None = (
            self.inbox
            if isinstance(self.inbox, TransactionalInbox) and self.inbox.joins(queue.database)
            else None
        )
        self.inbox_name: str | None = self.inbox.consumer if self.inbox is not None else None
        self.permanent_errors = opts.permanent_errors
        self.backoff = opts.backoff
        self.concurrency = validation.positive("concurrency", opts.concurrency)
        #: ``run_once``'s (and so ``run_forever``'s) batch: at least ``concurrency``.
        self.max_messages = (
            max(self.concurrency, DEFAULT_MAX_MESSAGES)
            if opts.max_messages is None
            else validation.positive("max_messages", opts.max_messages)
        )
        #: ``run_forever``'s receives: ``max_messages`` when named, else from it up to 100
        self._size = ReceiveSize(self.max_messages, grows=opts.max_messages is None)
        self.poll_interval = opts.poll_interval
        self.renew_check_interval = opts.renew_check_interval
        self._with_connection = takes_connection(handler)
        if self._with_connection and self.inbox is not None and self._joined is None:
            raise ConfigurationError(
                f"the handler takes a Connection, so its work commits in the queue's SQL "
                f"transaction, which the inbox {type(self.inbox).__name__} cannot join",
                hint="use the SQL inbox (inbox=True) with such a handler, or a handler without "
                "a Connection argument",
            )
        #: who claims in the inbox (each delivery adds its lock token: two deliveries of one id
        #: to this consumer's threads are two claimers), and for how long
        self.owner = opts.claim_owner or default_owner()
        if opts.inbox_lease is not None and not opts.inbox_lease > 0:
            raise ConfigurationError(f"inbox_lease must be positive, got {opts.inbox_lease!r}")
        self.inbox_lease = (
            queue.lock_duration if opts.inbox_lease is None else timedelta(seconds=opts.inbox_lease)
        )
        self.look_again = opts.look_again
        self._keeper = (
            ClaimKeeper(
                self.inbox, self.clock, self.inbox_lease, check_interval=opts.renew_check_interval
            )
            if self.inbox is not None
            else None
        )
        self.pruner = (
            InboxPruner(
                self.inbox,
                self.clock,
                retention=opts.inbox_retention,
                window=queue.duplicate_detection_window,
            )
            if self.inbox is not None
            else None
        )
        plain = not self._with_connection and self.inbox is None
        self.claimed = claimed_receive(opts, self.queue_name, self.clock, plain=plain)
        self._stopping = threading.Event()
        self._unsettled = Unsettled()  # held (renewed) from their receive until each is settled
        #: handled messages waiting for their completion (``completer``)
        self.completer = Completer(
            queue.receiver.complete_many,
            self._unsettled.discard,
            self.clock,
            batch=opts.complete_batch,
            delay=opts.complete_delay,
        )
        self.prefetch = opts.prefetch and not self._with_connection
        self._ahead: list[ReceivedMessage] = []  # received while the last batch ran
        self._renewing = False
        # one thread runs the handlers in line: no pool, no future per message
        self._pool = (
            ThreadPoolExecutor(self.concurrency, thread_name_prefix="outbox-consumer")
            if self.concurrency > 1
            else None
        )
        self.processed = 0

    # --- running ---------------------------------------------------------------------------

    def run_once(self, max_messages: int | None = None) -> int:
        """Receive up to ``max_messages`` (default ``self.max_messages``), handle them
        ``concurrency`` at a time, complete the handled ones, return how many were received and
        settled (0: nothing deliverable). A message abandoned here is not received again in the
        same call.

        A batch holds at most a session's head, so never two messages whose order matters. The
        locks of messages waiting for a thread are renewed with the running ones', except with a
        ``Connection`` handler (its transaction is the queue's writer): there a lock that expires
        before its turn skips the message (redelivered), so keep batch x handler time short.
        """
        if self._stopping.is_set():
            return 0
        wanted = validation.positive(
            "max_messages", max_messages if max_messages is not None else self.max_messages
        )
        with self._holding():
            batch = self._receive(wanted)
            if batch:
                self._handle(batch, ahead=False)
            self.completer.flush()
        return len(batch)

    def run_forever(self) -> None:
        """Poll until ``stop()``, SIGTERM or SIGINT (the shared ``RunLoop``): an idle poll waits
        ``poll_interval`` seconds by the clock; the queue being unavailable is retried with
        backoff; any other error ends the loop and is raised. A second signal is handled the
        default way. On the way out, a batch received ahead is abandoned and the handled
        messages are completed (not when a ``BaseException`` ends the process: at most
        ``complete_batch`` of them are redelivered)."""
        loop = RunLoop(
            self._poll,
            clock=self.clock,
            idle_wait=self.poll_interval,
            on_error=self._queue_unavailable,
            stop_event=self._stopping,
        )
        try:
            with self._holding():
                try:
                    loop.run()
                except Exception:
                    self._let_go()
                    raise
                self._let_go()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _poll(self) -> int:
        """One step of ``run_forever``: handle the batch received ahead, or a fresh one; flush
        the handled ones when nothing more is in hand (none received ahead, or, without a
        receive ahead, this receive came back empty)."""
        batch, self._ahead = self._ahead or self._receive(self._size.size), []
        ahead = self.prefetch and self._pool is not None
        if batch:
            started = self.clock.now()
            self._handle(batch, ahead=ahead)
            self._size.handled((self.clock.now() - started).total_seconds())
        if not (self._ahead if ahead else batch) or self.completer.due():
            self.completer.flush()
        return len(batch)

    def _receive(self, wanted: int) -> list[ReceivedMessage]:
        if self.pruner is not None:
            self.pruner.maybe_prune()
        batch = self.queue.receive(self.queue_name, wanted)
        self._unsettled.add(batch)
        self._size.received(wanted, len(batch))
        return batch

    def _handle(self, batch: Sequence[ReceivedMessage], *, ahead: bool) -> None:
        """Run ``batch``'s handlers; with ``ahead`` and a pool, receive the next batch (into
        ``_ahead``) while they run. Every message is processed (so none stays held) before the
        first error out of one is raised."""
        if self._pool is None:
            errors = []
            for msg in batch:
                try:
                    self._process(msg)
                except Exception as e:
                    errors.append(e)
            if errors:
                raise errors[0]
            return
        futures = [self._pool.submit(self._process, msg) for msg in batch]
        try:
            if ahead and not self._stopping.is_set():
                self._ahead = self._receive(self._size.size)
        finally:
            wait(futures)
        for future in futures:
            future.result()

    def _let_go(self) -> None:
        """Stopping: abandon the batch received ahead (its locks released at once), complete
        the handled messages."""
        ahead, self._ahead = self._ahead, []
        for msg in ahead:
            try:
                self._settle(self.queue.abandon, msg)
            except Exception as e:  # its lock runs out by itself
                log.warning("could not abandon message %s: %s", msg.message_id, e)
        self._unsettled.discard(ahead)
        self.completer.flush()

    @contextmanager
    def _holding(self) -> Iterator[None]:
        """Renew the locks of every message held, and the inbox's or claim log's claims, for
        the block (once: ``run_forever``'s polls share it). A ``Connection`` handler completes
        inside its transaction, which keeps the row from other receivers: nothing to renew."""
        if self._renewing or self._with_connection:
            yield
            return
        claims: AbstractContextManager[None] = nullcontext()
        if self.claimed is not None:
            claims = self.claimed.renewing()
        elif self._keeper is not None:
            claims = self._keeper.renewing()
        with ExitStack() as stack:
            stack.enter_context(
                LockRenewer(
                    self.queue,
                    self._unsettled,
                    self.clock,
                    check_interval=self.renew_check_interval,
                )
            )
            stack.enter_context(claims)
            self._renewing = True
            try:
                yield
            finally:
                self._renewing = False

    @staticmethod
    def _queue_unavailable(error: Exception, delay: float) -> None:
        log.warning("queue unavailable, retrying in %.1fs: %s", delay, error)

    def stop(self) -> None:
        """Stop receiving; running handlers finish, messages not yet started are abandoned, the
        handled ones completed."""
        self._stopping.set()

    # --- one message -------------------------------------------------------------------------

    def _process(self, msg: ReceivedMessage) -> None:
        handed = False
        try:
            handed = self._process_held(msg)
        finally:
            if not handed:  # a handed one stays held (renewed) until the completer's flush
                self._unsettled.pop(msg)

    def _process_held(self, msg: ReceivedMessage) -> bool:
        """Handle and settle ``msg``; True when it was handed to the completer."""
        if self._stopping.is_set():
            self._settle(self.queue.abandon, msg)  # release the lock now, not after expiry
            return False
        if not telemetry.tracing():  # no span to build when no one records them
            return self._run(msg)
        attributes = {
            "messaging.destination.name": msg.queue,
            "messaging.message.id": msg.message_id,
        }
        with telemetry.span(
            "outbox.consume",
            parent=telemetry.extract_context(msg.headers),  # the sender's request
            attributes=attributes,
            kind=SpanKind.CONSUMER,
        ):
            return self._run(msg)

    def _run(self, msg: ReceivedMessage) -> bool:
        if self._with_connection:
            run_in_transaction(self, msg)
            return False
        if self.claimed is not None:
            self.claimed.process(self, msg)
            return False
        if self._keeper is None:
            return self._run_bare(msg)
        run_with_inbox(self, self._keeper, msg)
        return False

    def _run_bare(self, msg: ReceivedMessage) -> bool:
        """No inbox, no claim log: the handler, then on success the completer (True)."""
        failed = self._call(msg)
        if failed is not None:
            failed()
            return False
        self.processed += 1
        self.completer.add(msg)
        return True

    def _call(self, msg: ReceivedMessage) -> Callable[[], None] | None:
        """Run the handler: None when it succeeded, else the settlement its outcome asks for."""
        caught: tuple[type[BaseException], ...] = (Exception, *self.permanent_errors)
        try:
            result = self.handler(msg)  # type: ignore[call-arg]
        except caught as e:
            error = e
            return lambda: self._settle_failure(msg, error)
        if isinstance(result, DeferMessage):
            return lambda: self._defer(msg, result)
        return None

    def _settle_failure(self, msg: ReceivedMessage, error: BaseException) -> None:
        """Settle as the handler's failure asks: defer (``DeferMessage``), dead-letter (a
        permanent error) or abandon with backoff (any other exception)."""
        if isinstance(error, DeferMessage):
            self._defer(msg, error)
        elif isinstance(error, self.permanent_errors):
            self._dead_letter(msg, error)
        else:
            assert isinstance(error, Exception)  # only permanent errors may be BaseExceptions
            self._abandon(msg, error)

    def _owner(self, msg: ReceivedMessage) -> str:
        return f"{self.owner}:{msg.lock_token or msg.sequence_number}"

    def _wait_for(self, msg: ReceivedMessage, claim: InboxClaim) -> None:
        """Another delivery of the id is being handled: abandon this one until that claim's lease
        ends (at least ``look_again`` seconds, at most one lease), then look again. Never drop
        it: the holder may crash."""
        now = self.clock.now()
        lease = self.inbox_lease.total_seconds()
        left = lease if claim.lease_until is None else (claim.lease_until - now).total_seconds()
        delay = min(max(left, self.look_again), lease)
        log.info(
            "message %s is being handled by %s; this delivery waits %.1fs",
            msg.message_id,
            claim.owner,
            delay,
        )
        self._settle(lambda m: self.queue.abandon(m, delay=delay), msg)

    # --- settlement helpers --------------------------------------------------------------------

    def _abandon(self, msg: ReceivedMessage, error: Exception) -> None:
        telemetry.record_error(error)
        delay = self.backoff(msg.delivery_count)
        log.warning(
            "handler failed for message %s (delivery %d), retrying in %.1fs: %r",
            msg.message_id,
            msg.delivery_count,
            delay,
            error,
        )
        self._settle(lambda m: self.queue.abandon(m, delay=delay), msg)

    def _defer(self, msg: ReceivedMessage, outcome: DeferMessage) -> None:
        """The handler said "not now": set the message aside (``receive_deferred`` by number)."""
        log.info("message %s (seq %d) deferred: %s", msg.message_id, msg.sequence_number, outcome)
        self._settle(self.queue.defer, msg)

    def _dead_letter(self, msg: ReceivedMessage, error: BaseException) -> None:
        log.error("message %s is poison, dead-lettering: %r", msg.message_id, error)
        telemetry.record_error(error)
        telemetry.instrument("counter", "outbox.consumer.dead_lettered", "1", "dead letters").add(1)
        reason = type(error).__name__[:256]
        self._settle(lambda m: self.queue.dead_letter(m, reason, str(error)), msg)

    @staticmethod
    def _settle(action: Callable[[ReceivedMessage], object], msg: ReceivedMessage) -> None:
        try:
            action(msg)
        except LockLostError as e:
            log.warning("%s", e)

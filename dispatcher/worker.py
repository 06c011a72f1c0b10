"""The command worker behind ``outbox run-dispatcher``: it finishes what immediate dispatch left.

It receives ``ProcessDocument`` commands (session = document id, so one worker at a time holds a
document), reads the documents' *current* rows, sends what is pending (up to the current
``last_seq``, which may be past the command's ``up_to_seq``), advances the watermarks in one MERGE
for the whole batch, and settles each command by outcome:

* done (or nothing left pending) -> ``complete``;
* a retryable failure, the watermark not written, or the document not visible yet (another writer
  may enqueue before its Delta commit lands) -> ``abandon`` with exponential backoff;
* a permanent transport failure, a malformed command or a command for another table ->
  ``dead_letter`` with the reason; and past ``max_delivery_count`` deliveries -> dead letter with
  ``MaxDeliveryCountExceeded`` and the last error.

Every step is idempotent (I6): a command redelivered after a crash re-sends with the same
message ids, and the watermark only moves up. Several workers, in threads or processes, can share a
queue: the session lock keeps each document with one of them at a time.

On SIGTERM/SIGINT the worker stops receiving, finishes the batch in hand (sends are bounded),
settles it, and returns; the CLI then exits 0. Messages it holds but has not started are abandoned
at once, so their locks are released instead of waiting for expiry. A second signal is handled the
default way.

Errors: a retryable one (the queue database briefly unreachable) is logged and the loop tries again
after ``poll_interval``; anything else stops every thread, and ``run()`` raises it (the CLI prints
one line and exits non-zero), so a worker never keeps running with dead threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.commands import ProcessDocument
from dispatcher.queue.consumer import ExponentialBackoff
from dispatcher.queue.lock_renewer import LockRenewer
from dispatcher.queue.signals import stop_on_signals
from dispatcher.queue.sql_queue import MAX_DELIVERY_REASON
from outbox.core.clock import SystemClock
from outbox.core.errors import LockLostError, OutboxError, ValidationError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.worker")


@dataclass
class WorkerStats:
    """Totals over a worker's run (the CLI prints them; ``--json`` as an object)."""

    batches: int = 0
    commands: int = 0
    completed: int = 0
    abandoned: int = 0
    dead_lettered: int = 0
    messages_sent: int = 0
    lock_lost: int = 0
    stopped_by_signal: bool = False

    def add(self, other: WorkerStats) -> None:
        for name in (
            "batches",
            "commands",
            "completed",
            "abandoned",
            "dead_lettered",
            "messages_sent",
            "lock_lost",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Held:
    """The messages of one batch not settled yet: what that batch's lock renewer keeps alive."""

    def __init__(self, received: Sequence[ReceivedMessage]) -> None:
        self._lock = threading.Lock()
        self._messages = {m.sequence_number: m for m in received}

    def __call__(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self._messages.values())

    def pop(self, msg: ReceivedMessage) -> None:
        with self._lock:
            self._messages.pop(msg.sequence_number, None)

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()


class DispatcherWorker:
    """Receives ``ProcessDocument`` commands and dispatches their documents."""

    def __init__(
        self,
        runtime: DispatcherRuntime,
        *,
        concurrency: int = 1,
        batch_size: int = 32,
        poll_interval: float = 0.5,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        seed: int | None = None,
        renew_check_interval: float = 1.0,
    ) -> None:
        if concurrency < 1 or batch_size < 1:
            raise ValidationError(
                f"concurrency ({concurrency!r}) and batch_size ({batch_size!r}) must be at least 1"
            )
        if poll_interval < 0:
            raise ValidationError(f"poll_interval {poll_interval!r} must not be negative")
        self.runtime = runtime
        self.store = runtime.store
        self.queue = runtime.queue
        self.dispatcher = runtime.dispatcher
        self.metrics = runtime.metrics
        self.crash_points = runtime.crash_points
        self.clock = runtime.clock
        self.command_queue = runtime.settings.command_queue
        # The queue dead-letters at its own limit; deciding with the same number keeps the two
        # from disagreeing when a queue is shared with other settings.
        self.max_delivery_count = self.queue.max_delivery_count
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.backoff = ExponentialBackoff(base=backoff_base, cap=backoff_max, jitter=0.1, seed=seed)
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self.stats = WorkerStats()
        self.renew_check_interval = renew_check_interval
        self._failure: BaseException | None = None

    # --- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loops to stop after the batch in hand (what the signal handlers call)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- the loop ---------------------------------------------------------------------------

    def run(self, *, once: bool = False, until_idle: bool = False) -> WorkerStats:
        """Receive and handle batches until stopped.

        ``once``: drain what is deliverable now, then return. ``until_idle``: keep going (waiting
        for scheduled and backed-off commands) until the command queue holds nothing at all.

        Raises the first non-retryable error any thread met (after every thread has stopped).
        """
        with stop_on_signals(self.stop) as signals:
            log.info(
                "worker ready: receiving from %r with %d thread(s)",
                self.command_queue,
                self.concurrency,
            )
            if self.concurrency == 1:
                self._loop(once=once, until_idle=until_idle)
            else:
                threads = [
                    threading.Thread(
                        target=self._loop,
                        kwargs={"once": once, "until_idle": until_idle},
                        name=f"outbox-worker-{i}",
                        daemon=True,
                    )
                    for i in range(self.concurrency)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    while t.is_alive():  # join in slices so the main thread still sees signals
                        t.join(0.2)
        self.stats.stopped_by_signal = signals.received is not None
        if self._failure is not None:
            raise self._failure
        return self.stats

    def _loop(self, *, once: bool, until_idle: bool) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if self._poll(once=once, until_idle=until_idle):
                        return
                except OutboxError as e:
                    if not e.retryable:
                        raise
                    self.metrics.inc("worker_queue_errors")
                    log.warning(
                        "the command queue is unavailable (%s); retrying in %.1fs",
                        e,
                        self.poll_interval,
                    )
                self._sleep(self.poll_interval)
        except BaseException as e:  # recorded for run() to raise; the other threads stop too
            with self._stats_lock:
                first = self._failure is None
                if first:
                    self._failure = e
            if not first and isinstance(e, Exception):  # the first one is raised by run()
                log.warning("worker thread also failed: %s", e)
            self.stop()

    def _poll(self, *, once: bool, until_idle: bool) -> bool:
        """One receive; True when the loop is done."""
        while not self._stop.is_set():
            received = self.queue.receive(self.command_queue, self.batch_size)
            if not received:
                # Idle: a good moment for the queue's housekeeping (bounded, at most every half
                # duplicate-detection window, never raises).
                self.queue.maybe_forget_expired_duplicates()
                return once or (until_idle and self._idle())
            if self._stop.is_set():
                self._release(received)  # stopped while receiving: give the locks back now
                return True
            self.handle_batch(received)
        return True

    def _idle(self) -> bool:
        stats = self.queue.stats(self.command_queue).get(self.command_queue)
        return stats is None or stats.total == 0

    def _sleep(self, seconds: float) -> None:
        # On the real clock, wait on the stop event so a signal ends the wait at once; a test
        # clock just skips ahead (to scheduled and backed-off commands) without sleeping.
        if isinstance(self.clock, SystemClock):
            self._stop.wait(seconds)
        else:
            self.clock.sleep(seconds)

    def _release(self, received: Sequence[ReceivedMessage]) -> None:
        for msg in received:
            try:
                self.queue.abandon(msg, 0)
            except Exception as e:  # the lock expires on its own
                log.info("command %s: release failed (%s)", msg.message_id, e)

    # --- one batch --------------------------------------------------------------------------

    def handle_batch(self, received: Sequence[ReceivedMessage]) -> WorkerStats:
        """Handle locked commands: read, send, one watermark MERGE, settle each. Never raises
        ``Exception`` (a failure abandons); ``InjectedCrash`` passes through like a real crash."""
        t0 = time.perf_counter()
        batch = WorkerStats(batches=1, commands=len(received))
        held = _Held(received)  # this batch's own: another thread's renewer never sees it
        try:
            self._handle_batch(batch, held, received)
        finally:
            held.clear()  # settled or not, the renewer must not keep these locks any longer
        log.info(
            "batch: %d command(s), %d message(s) sent; completed %d, abandoned %d, "
            "dead-lettered %d (%.1f ms)",
            batch.commands,
            batch.messages_sent,
            batch.completed,
            batch.abandoned,
            batch.dead_lettered,
            (time.perf_counter() - t0) * 1000,
        )
        with self._stats_lock:
            self.stats.add(batch)
        return batch

    def _handle_batch(
        self, batch: WorkerStats, held: _Held, received: Sequence[ReceivedMessage]
    ) -> None:
        commands: list[tuple[ReceivedMessage, ProcessDocument]] = []
        for msg in received:
            try:
                cmd = ProcessDocument.from_json(msg.body)
            except OutboxError as e:
                self._settle(batch, held, msg, "dead_letter", "MalformedCommand", str(e))
                continue
            if cmd.table != self.store.table_id:
                self._settle(
                    batch,
                    held,
                    msg,
                    "dead_letter",
                    "WrongTable",
                    f"command for table {cmd.table} ({cmd.table_uri or 'no uri'}); this worker "
                    f"serves table {self.store.table_id} at {self.store.uri}. Run a worker "
                    "with that table's workspace, or requeue it there",
                )
                continue
            commands.append((msg, cmd))
        if not commands:
            return
        # A slow broker or a big batch can outlive the lock: keep the locks of the commands
        # still in hand alive until each is settled.
        with LockRenewer(self.queue, held, self.clock, check_interval=self.renew_check_interval):
            try:
                self._handle_commands(batch, held, commands)
            except Exception as e:  # a bug or an unexpected failure: retry what is unsettled
                log.exception("batch failed unexpectedly; abandoning its unsettled commands")
                for msg in held():
                    self._retry(batch, held, msg, f"unexpected error: {e!r}")

    def _handle_commands(
        self,
        batch: WorkerStats,
        held: _Held,
        commands: list[tuple[ReceivedMessage, ProcessDocument]],
    ) -> None:
        ids = list(dict.fromkeys(cmd.id for _, cmd in commands))
        try:
            _, rows = self.store.read(ids)
        except Exception as e:
            log.warning(
                "reading %d document(s) failed (%s); abandoning their commands", len(ids), e
            )
            for msg, _ in commands:
                self._retry(batch, held, msg, f"reading the document failed: {e}")
            return
        self.crash_points.hit("worker_holding")
        report = self.dispatcher.dispatch([r for r in rows.values() if r.has_pending])
        batch.messages_sent += report.messages_sent
        for msg, cmd in commands:
            row = rows.get(cmd.id)
            if row is None:
                self._retry(
                    batch,
                    held,
                    msg,
                    f"document {cmd.id!r} is not in {self.store.uri} (yet); if another writer "
                    "enqueued the command before its commit, it will appear",
                    reason="DocumentNotFound",
                )
                continue
            outcome = report.outcomes.get(cmd.id)
            if outcome is not None and outcome.permanent:
                self._settle(
                    batch,
                    held,
                    msg,
                    "dead_letter",
                    "PermanentTransportError",
                    str(outcome.error),
                )
            elif outcome is not None and not outcome.complete:
                self._retry(batch, held, msg, f"send failed: {outcome.error}")
            elif outcome is not None and outcome.progressed and report.watermark_error:
                self._retry(batch, held, msg, f"watermark not written: {report.watermark_error}")
            elif row.last_seq < cmd.up_to_seq:
                self._retry(
                    batch,
                    held,
                    msg,
                    f"document {cmd.id!r} has last_seq {row.last_seq} < {cmd.up_to_seq}; the "
                    "commit the command names is not visible yet",
                    reason="DocumentNotFound",
                )
            else:
                self._settle(batch, held, msg, "complete")

    # --- settling ---------------------------------------------------------------------------

    def _retry(
        self,
        batch: WorkerStats,
        held: _Held,
        msg: ReceivedMessage,
        why: str,
        reason: str = MAX_DELIVERY_REASON,
    ) -> None:
        if msg.delivery_count >= self.max_delivery_count:
            self._settle(
                batch,
                held,
                msg,
                "dead_letter",
                reason,
                f"gave up after {msg.delivery_count} deliveries; last error: {why}",
            )
            return
        self._settle(batch, held, msg, "abandon", delay=self.backoff(msg.delivery_count), why=why)

    def _settle(
        self,
        batch: WorkerStats,
        held: _Held,
        msg: ReceivedMessage,
        how: str,
        reason: str = "",
        description: str = "",
        *,
        delay: float = 0.0,
        why: str = "",
    ) -> None:
        held.pop(msg)
        action: Callable[[], None]
        if how == "complete":
            action = lambda: self.queue.complete(msg)  # noqa: E731
        elif how == "abandon":
            action = lambda: self.queue.abandon(msg, delay)  # noqa: E731
        else:
            action = lambda: self.queue.dead_letter(msg, reason, description[:4000])  # noqa: E731
        try:
            action()
        except LockLostError:
            # Another worker has (or will have) the command; our work was idempotent (I6).
            batch.lock_lost += 1
            self.metrics.inc("lock_lost")
            log.info("command %s: lock lost before %s; it is redelivered", msg.message_id, how)
            return
        except Exception as e:
            log.warning(
                "command %s: %s failed (%s); its lock expires and it is redelivered",
                msg.message_id,
                how,
                e,
            )
            return
        if how == "complete":
            batch.completed += 1
            self.metrics.inc("commands_completed")
        elif how == "abandon":
            batch.abandoned += 1
            self.metrics.inc("commands_abandoned")
            log.info("command %s: retry in %.1fs (%s)", msg.message_id, delay, why)
        else:
            batch.dead_lettered += 1
            self.metrics.inc("commands_dead_lettered")
            log.warning("command %s dead-lettered: %s: %s", msg.message_id, reason, description)

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
at once, so their locks are released instead of waiting for expiry.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from dispatcher.commands import ProcessDocument
from dispatcher.queue.lock_renewer import LockRenewer
from outbox.clock import SystemClock
from outbox.errors import LockLostError, OutboxError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.worker")

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"


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
            raise ValueError("concurrency and batch_size must be at least 1")
        self.runtime = runtime
        self.store = runtime.store
        self.queue = runtime.queue
        self.dispatcher = runtime.dispatcher
        self.metrics = runtime.metrics
        self.crash_points = runtime.crash_points
        self.clock = runtime.clock
        self.command_queue = runtime.settings.command_queue
        self.max_delivery_count = runtime.settings.max_delivery_count
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self.stats = WorkerStats()
        self.renew_check_interval = renew_check_interval
        self._holding: dict[int, ReceivedMessage] = {}
        self._holding_lock = threading.Lock()

    # --- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loops to stop after the batch in hand (what the signal handlers call)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def backoff(self, delivery_count: int) -> float:
        """Exponential backoff for the ``delivery_count``-th failed delivery, with 0-10% jitter."""
        base = min(self.backoff_max, self.backoff_base * 2 ** max(0, delivery_count - 1))
        return float(base * (1 + 0.1 * self._rng.random()))

    # --- the loop ---------------------------------------------------------------------------

    def run(self, *, once: bool = False, until_idle: bool = False) -> WorkerStats:
        """Receive and handle batches until stopped.

        ``once``: drain what is deliverable now, then return. ``until_idle``: keep going (waiting
        for scheduled and backed-off commands) until the command queue holds nothing at all.
        """
        with self._signals():
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
        self.stats.stopped_by_signal = self._stop.is_set() and self._signalled
        return self.stats

    _signalled = False

    def _loop(self, *, once: bool, until_idle: bool) -> None:
        while not self._stop.is_set():
            received = self.queue.receive(self.command_queue, self.batch_size)
            if received and self._stop.is_set():
                self._release(received)  # stopped while receiving: give the locks back now
                return
            if received:
                self.handle_batch(received)
                continue
            if once or (until_idle and self._idle()):
                return
            self._sleep(self.poll_interval)

    def _idle(self) -> bool:
        stats = self.queue.stats().get(self.command_queue)
        return stats is None or stats.total == 0

    def _sleep(self, seconds: float) -> None:
        # On the real clock, wait on the stop event so a signal ends the wait at once; a test
        # clock just skips ahead (to scheduled and backed-off commands) without sleeping.
        if isinstance(self.clock, SystemClock):
            self._stop.wait(seconds)
        else:
            self.clock.sleep(seconds)

    @contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info(
                "received %s: finishing the batch in hand, then stopping",
                signal.Signals(signum).name,
            )
            self._signalled = True
            self.stop()

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _release(self, received: Sequence[ReceivedMessage]) -> None:
        for msg in received:
            try:
                self.queue.abandon(msg, 0)
            except Exception as e:  # the lock expires on its own
                log.info("command %s: release failed (%s)", msg.message_id, e)

    def _in_hand(self) -> list[ReceivedMessage]:
        with self._holding_lock:
            return list(self._holding.values())

    # --- one batch --------------------------------------------------------------------------

    def handle_batch(self, received: Sequence[ReceivedMessage]) -> WorkerStats:
        """Handle locked commands: read, send, one watermark MERGE, settle each. Never raises
        ``Exception`` (a failure abandons); ``InjectedCrash`` passes through like a real crash."""
        t0 = time.perf_counter()
        batch = WorkerStats(batches=1, commands=len(received))
        with self._holding_lock:
            self._holding.update((m.sequence_number, m) for m in received)
        commands: list[tuple[ReceivedMessage, ProcessDocument]] = []
        for msg in received:
            try:
                cmd = ProcessDocument.from_json(msg.body)
            except OutboxError as e:
                self._settle(batch, msg, "dead_letter", "MalformedCommand", str(e))
                continue
            if cmd.table != self.store.table_id:
                self._settle(
                    batch,
                    msg,
                    "dead_letter",
                    "WrongTable",
                    f"command for table {cmd.table} ({cmd.table_uri or 'no uri'}); this worker "
                    f"serves table {self.store.table_id} at {self.store.uri}. Run a worker "
                    "with that table's workspace, or requeue it there",
                )
                continue
            commands.append((msg, cmd))
        if commands:
            # A slow broker or a big batch can outlive the lock: keep the locks of the commands
            # still in hand alive until each is settled.
            with LockRenewer(
                self.queue, self._in_hand, self.clock, check_interval=self.renew_check_interval
            ):
                self._handle_commands(batch, commands)
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

    def _handle_commands(
        self, batch: WorkerStats, commands: list[tuple[ReceivedMessage, ProcessDocument]]
    ) -> None:
        ids = list(dict.fromkeys(cmd.id for _, cmd in commands))
        try:
            _, rows = self.store.read(ids)
        except Exception as e:
            log.warning(
                "reading %d document(s) failed (%s); abandoning their commands", len(ids), e
            )
            for msg, _ in commands:
                self._retry(batch, msg, f"reading the document failed: {e}")
            return
        self.crash_points.hit("worker_holding")
        report = self.dispatcher.dispatch([r for r in rows.values() if r.has_pending])
        batch.messages_sent += report.messages_sent
        for msg, cmd in commands:
            row = rows.get(cmd.id)
            if row is None:
                self._retry(
                    batch,
                    msg,
                    f"document {cmd.id!r} is not in {self.store.uri} (yet); if another writer "
                    "enqueued the command before its commit, it will appear",
                    reason="DocumentNotFound",
                )
                continue
            outcome = report.outcomes.get(cmd.id)
            if outcome is not None and outcome.permanent:
                self._settle(
                    batch, msg, "dead_letter", "PermanentTransportError", str(outcome.error)
                )
            elif outcome is not None and not outcome.complete:
                self._retry(batch, msg, f"send failed: {outcome.error}")
            elif outcome is not None and outcome.progressed and report.watermark_error:
                self._retry(batch, msg, f"watermark not written: {report.watermark_error}")
            elif row.last_seq < cmd.up_to_seq:
                self._retry(
                    batch,
                    msg,
                    f"document {cmd.id!r} has last_seq {row.last_seq} < {cmd.up_to_seq}; the "
                    "commit the command names is not visible yet",
                    reason="DocumentNotFound",
                )
            else:
                self._settle(batch, msg, "complete")

    # --- settling ---------------------------------------------------------------------------

    def _retry(
        self, batch: WorkerStats, msg: ReceivedMessage, why: str, reason: str = MAX_DELIVERY_REASON
    ) -> None:
        if msg.delivery_count >= self.max_delivery_count:
            self._settle(
                batch,
                msg,
                "dead_letter",
                reason,
                f"gave up after {msg.delivery_count} deliveries; last error: {why}",
            )
            return
        self._settle(batch, msg, "abandon", delay=self.backoff(msg.delivery_count), why=why)

    def _settle(
        self,
        batch: WorkerStats,
        msg: ReceivedMessage,
        how: str,
        reason: str = "",
        description: str = "",
        *,
        delay: float = 0.0,
        why: str = "",
    ) -> None:
        with self._holding_lock:
            self._holding.pop(msg.sequence_number, None)
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

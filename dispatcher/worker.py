"""The command worker behind ``outbox run-dispatcher``: it finishes what immediate dispatch left.

It receives ``ProcessDocument`` commands (session = document id, so one worker at a time holds a
document) and hands each batch to the ``CommandHandler`` (``dispatcher.command_handler``: read the
current rows, send what is pending, one watermark MERGE, settle each command by outcome). The
chunks of ``outbox replay`` (subject ``ReplayMessages``) go to ``dispatcher.replay_handler``
instead. Several workers, in threads or processes, can share a queue: the session lock keeps each
document with one of them at a time.

Each thread runs the shared ``outbox.core.runloop.RunLoop``: a receive that returns nothing waits
``poll_interval`` by the clock (and is a good moment for the queue's housekeeping).

On SIGTERM/SIGINT the worker stops receiving, finishes the batch in hand (sends are bounded),
settles it, and returns; the CLI then exits 0. Messages it holds but has not started are abandoned
at once, so their locks are released instead of waiting for expiry. A second signal is handled the
default way.

Errors: a retryable one (the queue database briefly unreachable) is logged and the loop tries again
after a backoff that starts at ``poll_interval``; anything else stops every thread, and ``run()``
raises it (the CLI prints one line and exits non-zero), so a worker never keeps running with dead
threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict, Unpack

from dispatcher.command_handler import CommandHandler, WorkerStats
from dispatcher.replay_handler import REPLAY_SUBJECT, ReplayHandler
from outbox.core.backoff import ExponentialBackoff
from outbox.core.errors import ValidationError
from outbox.core.runloop import RunLoop, run_loops

if TYPE_CHECKING:
    from dispatcher.queue.messages import QueueStats, ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.worker")

__all__ = ["DispatcherWorker", "WorkerOptions", "WorkerStats", "describe_wait"]


def describe_wait(queue: str, depth: QueueStats | None) -> str:
    """What an idle worker waits for, from the command queue's depth, in an operator's words."""
    if depth is None or depth.total == 0:
        return f"the command queue {queue!r} is empty"
    parts = []
    if depth.locked:
        parts.append(
            f"{depth.locked} command(s) locked by another worker (or by a stopped one, until "
            "its lock expires)"
        )
    if depth.scheduled:
        parts.append(f"{depth.scheduled} command(s) backing off after a failure, or scheduled")
    if depth.active:
        parts.append(f"{depth.active} command(s) ready whose document another worker holds")
    if depth.deferred:
        parts.append(f"{depth.deferred} command(s) deferred (received only by sequence number)")
    return f"{queue!r}: " + "; ".join(parts)


@dataclass(frozen=True)
class WorkerOptions:
    """What a ``DispatcherWorker`` takes besides its runtime.

    ``concurrency`` threads each receive up to ``batch_size`` commands; an idle receive waits
    ``poll_interval``; a failed command is retried after an exponential backoff from
    ``backoff_base`` to ``backoff_max`` seconds (10% jitter, replayable with ``seed``);
    ``renew_check_interval``: how often held locks are looked at for renewal;
    ``wait_log_interval``: while nothing is deliverable, how often (at most) the worker logs what
    it waits for (an empty queue, commands locked by another or a stopped worker, commands
    backing off), so a quiet worker is never a mystery."""

    concurrency: int = 1
    batch_size: int = 32
    poll_interval: float = 0.5
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    seed: int | None = None
    renew_check_interval: float = 1.0
    wait_log_interval: float = 30.0


class WorkerKeywords(TypedDict, total=False):
    """``WorkerOptions``' fields as ``DispatcherWorker``'s keyword arguments."""

    concurrency: int
    batch_size: int
    poll_interval: float
    backoff_base: float
    backoff_max: float
    seed: int | None
    renew_check_interval: float
    wait_log_interval: float


class DispatcherWorker:
    """Receives ``ProcessDocument`` commands and dispatches their documents.

    ``DispatcherWorker(runtime, ...)`` shares the runtime's transport, queue and dispatcher, and
    grows the queue's connection pool for its threads."""

    def __init__(
        self,
        runtime: DispatcherRuntime,
        *,
        options: WorkerOptions | None = None,
        **keywords: Unpack[WorkerKeywords],
    ) -> None:
        """``options`` (``WorkerOptions``), and any of its fields as a keyword over it."""
        opts = self.options = replace(options or WorkerOptions(), **keywords)
        if opts.concurrency < 1 or opts.batch_size < 1:
            raise ValidationError(
                f"concurrency ({opts.concurrency!r}) and batch_size ({opts.batch_size!r}) must "
                "be at least 1"
            )
        if opts.poll_interval < 0:
            raise ValidationError(f"poll_interval {opts.poll_interval!r} must not be negative")
        self.runtime = runtime
        self.store = runtime.store
        self.queue = runtime.commands
        self.dispatcher = runtime.dispatcher
        self.metrics = runtime.metrics
        self.clock = runtime.clock
        self.command_queue = runtime.settings.command_queue
        self.concurrency = opts.concurrency
        self.batch_size = opts.batch_size
        self.poll_interval = opts.poll_interval
        self.backoff = ExponentialBackoff(
            base=opts.backoff_base, cap=opts.backoff_max, jitter=0.1, seed=opts.seed
        )
        self.handler = CommandHandler(
            runtime, backoff=self.backoff, renew_check_interval=opts.renew_check_interval
        )
        self.replays = ReplayHandler(runtime, self.handler)  # ``outbox replay``'s chunks
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self.stats = WorkerStats()
        self.wait_log_interval = opts.wait_log_interval
        self._wait_logged_at: datetime | None = None
        self.queue.ensure_pool_size(runtime.pool_size(opts.concurrency))

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
        stopped_by = run_loops(
            self.concurrency,
            self._make_loop,
            self.stop,
            name="outbox-worker",
            once=once,
            until_idle=self._idle if until_idle else None,
            ready=lambda: log.info(
                "worker ready: receiving from %r with %d thread(s)",
                self.command_queue,
                self.concurrency,
            ),
        )
        self.stats.stopped_by_signal = stopped_by is not None
        return self.stats

    def _make_loop(self) -> RunLoop:
        return RunLoop(
            self._poll,
            clock=self.clock,
            idle_wait=self.poll_interval,
            on_error=self._queue_unavailable,
            stop_event=self._stop,
        )

    def _poll(self) -> int:
        """One receive and its batch; returns how many commands were received."""
        received = self.queue.receive(self.command_queue, self.batch_size)
        if not received:
            # Idle: a good moment for the queue's housekeeping (bounded, at most every half
            # duplicate-detection window, never raises).
            self.queue.maybe_forget_expired_duplicates()
            self._log_wait()
            return 0
        if self._stop.is_set():
            self._release(received)  # stopped while receiving: give the locks back now
            return 0
        self.handle_batch(received)
        return len(received)

    def _log_wait(self) -> None:
        """Say what the idle worker waits for, at most once per ``wait_log_interval``."""
        now = self.clock.now()
        with self._stats_lock:
            last = self._wait_logged_at
            if last is not None and (now - last).total_seconds() < self.wait_log_interval:
                return
            self._wait_logged_at = now
        try:
            depth = self.queue.stats(self.command_queue).get(self.command_queue)
        except Exception as e:  # only a log line: the next receive reports a real outage
            log.debug("waiting: queue depth unavailable (%s)", e)
            return
        log.info("waiting: %s", describe_wait(self.command_queue, depth))

    def _queue_unavailable(self, error: Exception, delay: float) -> None:
        self.runtime.observe.queue_error()
        log.warning("the command queue is unavailable (%s); retrying in %.1fs", error, delay)

    def _idle(self) -> bool:
        stats = self.queue.stats(self.command_queue).get(self.command_queue)
        return stats is None or stats.total == 0

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
        replays = [m for m in received if m.subject == REPLAY_SUBJECT]
        commands = [m for m in received if m.subject != REPLAY_SUBJECT] if replays else received
        batch = self.handler.handle(commands) if commands else WorkerStats()
        if replays:
            batch.add(self.replays.handle(replays))
            batch.batches = 1
        with self._stats_lock:
            self.stats.add(batch)
        return batch

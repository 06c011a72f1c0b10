"""Handling one batch of ``ProcessDocument`` commands, for the ``run-dispatcher`` worker.

A batch is the commands one receive returned, all locked by this worker. The handler reads the
documents' *current* rows, sends what is pending (up to the current ``last_seq``, which may be past
the command's ``up_to_seq``), advances the watermarks in one commit for the whole batch, and settles
each command by outcome:

* done (or nothing left pending) -> ``complete``;
* a retryable failure, the watermark not written, or the document not visible yet (another writer
  may enqueue before its Delta commit lands) -> ``abandon`` with exponential backoff;
* a permanent transport failure, a malformed command or a command for another table ->
  ``dead_letter`` with the reason; and past ``max_delivery_count`` deliveries -> dead letter with
  ``MaxDeliveryCountExceeded`` and the last error.

Every step is idempotent (I6): a command redelivered after a crash re-sends with the same message
ids, and the watermark only moves up. Why apart from the worker: the worker is the run loop and its
threads; this is what one batch does, and it holds no state between batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.commands import ProcessDocument
from dispatcher.queue.lock_renewer import LockRenewer, Unsettled
from dispatcher.queue.sql_queue import MAX_DELIVERY_REASON
from outbox.core.errors import LockLostError, OutboxError
from outbox.core.observers import Settlement

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.worker")

#: Rounds of held documents one batch sends after it delivered gates (``_drain``).
DRAIN_ROUNDS = 50
#: Gates a batch (and each drain round) reads and tries, the keys paused longest first: after a
#: long outage every failed document may gate a key, and a batch must not read them all.
GATES_PER_BATCH = 100


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


class CommandHandler:
    """Handles batches of locked commands with the runtime's store, queue and dispatcher.

    Thread-safe: each batch keeps its own state, so a worker's threads share one handler."""

    def __init__(
        self,
        runtime: DispatcherRuntime,
        *,
        backoff: Callable[[int], float],
        renew_check_interval: float = 1.0,
    ) -> None:
        self.store = runtime.store
        self.queue = runtime.commands
        self.dispatcher = runtime.dispatcher
        self.observe = runtime.observe
        self.clock = runtime.clock
        # The queue dead-letters at its own limit; deciding with the same number keeps the two
        # from disagreeing when a queue is shared with other settings.
        self.max_delivery_count = self.queue.max_delivery_count
        self.backoff = backoff
        self.renew_check_interval = renew_check_interval

    def handle(self, received: Sequence[ReceivedMessage]) -> WorkerStats:
        """Handle locked commands: read, send, one watermark commit, settle each. Never raises
        ``Exception`` (a failure abandons); ``InjectedCrash`` passes through like a real crash."""
        t0 = time.perf_counter()
        batch = WorkerStats(batches=1, commands=len(received))
        held = Unsettled(received)  # this batch's own: another thread's renewer never sees it
        try:
            with self.observe.handling(received):
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
        return batch

    def _handle_batch(
        self, batch: WorkerStats, held: Unsettled, received: Sequence[ReceivedMessage]
    ) -> None:
        commands: list[tuple[ReceivedMessage, ProcessDocument]] = []
        for msg in received:
            try:
                cmd = ProcessDocument.from_json(msg.body)
            except OutboxError as e:
                self._dead_letter(batch, held, msg, "MalformedCommand", str(e))
                continue
            if cmd.table != self.store.table_id:
                self._dead_letter(
                    batch,
                    held,
                    msg,
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
        held: Unsettled,
        commands: list[tuple[ReceivedMessage, ProcessDocument]],
    ) -> None:
        ids = list(dict.fromkeys(cmd.id for _, cmd in commands))
        # The documents gating a paused key (in any process: the lines are shared) are read and
        # sent too: a gate delivered elsewhere shows in its watermark and passes on, and one
        # still pending is tried again now instead of when its own command's backoff ends, so a
        # key's line drains in order as soon as the broker answers.
        gates = sorted(self.dispatcher.keys.gates(GATES_PER_BATCH).difference(ids))
        try:
            _, rows = self.store.read(ids + gates)
        except Exception as e:
            log.warning(
                "reading %d document(s) failed (%s); abandoning their commands", len(ids), e
            )
            for msg, _ in commands:
                self._retry(batch, held, msg, f"reading the document failed: {e}")
            return
        self.observe.holding()
        if gates:
            self.dispatcher.forget_gates([g for g in gates if g not in rows])  # deleted
        report = self.dispatcher.dispatch([r for i in ids + gates if (r := rows.get(i))])
        batch.messages_sent += report.messages_sent
        if report.messages_sent:
            batch.messages_sent += self._drain(set(ids) | set(gates))
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
                self._dead_letter(
                    batch,
                    held,
                    msg,
                    "PermanentTransportError",
                    str(outcome.error),
                )
            elif outcome is not None and not outcome.complete:
                self._retry(batch, held, msg, f"send failed: {outcome.error}")
            elif outcome is not None and outcome.progressed and report.watermark_error:
                self._retry(batch, held, msg, f"watermark not written: {report.watermark_error}")
            elif row.last_seq < cmd.up_to_seq and row.incarnation == cmd.incarnation:
                # Only for the same incarnation: a command for an earlier one (the document was
                # deleted and created again) names messages that left with the deleted row, so
                # there is nothing to wait for and it completes below.
                self._retry(
                    batch,
                    held,
                    msg,
                    f"document {cmd.id!r} has last_seq {row.last_seq} < {cmd.up_to_seq}; the "
                    "commit the command names is not visible yet",
                    reason="DocumentNotFound",
                )
            else:
                self._complete(batch, held, msg)

    def _drain(self, tried: set[str]) -> int:
        """Send the documents that gates passed to during this batch, round after round, while
        sends go through: their own commands may wait out a long backoff from the outage, and
        each round lets the next held document of a key go. Returns the messages sent."""
        sent = 0
        for _ in range(DRAIN_ROUNDS):
            nxt = sorted(self.dispatcher.keys.gates(GATES_PER_BATCH) - tried)
            if not nxt:
                break
            tried.update(nxt)
            try:
                _, rows = self.store.read(nxt)
            except Exception as e:  # their commands (or the rescuer's) send them later
                log.info("reading the next held documents failed (%s); they wait", e)
                break
            self.dispatcher.forget_gates([g for g in nxt if g not in rows])
            report = self.dispatcher.dispatch(list(rows.values()))
            sent += report.messages_sent
            if not report.messages_sent:
                break
        return sent

    # --- settling ---------------------------------------------------------------------------

    def _retry(
        self,
        batch: WorkerStats,
        held: Unsettled,
        msg: ReceivedMessage,
        why: str,
        reason: str = MAX_DELIVERY_REASON,
    ) -> None:
        if msg.delivery_count >= self.max_delivery_count:
            description = f"gave up after {msg.delivery_count} deliveries; last error: {why}"
            self._dead_letter(batch, held, msg, reason, description)
            return
        delay = self.backoff(msg.delivery_count)
        abandon = lambda: self.queue.abandon(msg, delay)  # noqa: E731
        if self._settle(batch, held, msg, Settlement.ABANDON, abandon):
            batch.abandoned += 1
            log.info("command %s: retry in %.1fs (%s)", msg.message_id, delay, why)

    def _complete(self, batch: WorkerStats, held: Unsettled, msg: ReceivedMessage) -> None:
        if self._settle(batch, held, msg, Settlement.COMPLETE, lambda: self.queue.complete(msg)):
            batch.completed += 1

    def _dead_letter(
        self, batch: WorkerStats, held: Unsettled, msg: ReceivedMessage, reason: str, why: str
    ) -> None:
        def action() -> None:
            self.queue.dead_letter(msg, reason, why[:4000])

        if self._settle(batch, held, msg, Settlement.DEAD_LETTER, action):
            batch.dead_lettered += 1
            log.warning("command %s dead-lettered: %s: %s", msg.message_id, reason, why)

    def _settle(
        self,
        batch: WorkerStats,
        held: Unsettled,
        msg: ReceivedMessage,
        how: Settlement,
        action: Callable[[], None],
    ) -> bool:
        """Run the settlement ``action`` of ``msg``; True when it landed. A lost lock or a failed
        settlement is logged (and a lost lock counted): the command is redelivered, and the work
        was idempotent (I6)."""
        held.pop(msg)
        try:
            action()
        except LockLostError:
            # Another worker has (or will have) the command; our work was idempotent (I6).
            batch.lock_lost += 1
            self.observe.settled(Settlement.LOCK_LOST)
            log.info("command %s: lock lost before %s; it is redelivered", msg.message_id, how)
            return False
        except Exception as e:
            log.warning(
                "command %s: %s failed (%s); its lock expires and it is redelivered",
                msg.message_id,
                how,
                e,
            )
            return False
        self.observe.settled(how)
        return True

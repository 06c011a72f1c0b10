"""Completing a consumer's handled messages in batches, after their handlers returned (after
River's batch completer, riverqueue/river ``internal/jobcompleter``).

Completing each message on its own costs a write transaction (and on SQLite an fsync) per
message, more than everything else the consumer does for it. Here a handler's success only hands
its message to the ``Completer``; the message stays locked, and its lock renewed, until a flush
deletes it. A flush is ONE statement for the whole batch that checks each message's own lock and
says which rows went (``SqlQueueReceiver.complete_many``); one whose lock was lost meanwhile is
logged and left to be redelivered, as ``complete`` would have refused it.

When it flushes: once ``batch`` messages wait, once the oldest has waited ``delay`` seconds (by
the injected clock, looked at as messages come), and whenever the consumer has nothing more in
hand (its loop asks: ``flush``). What it keeps:

* at-least-once: a message is completed only after its handler returned;
* the redelivery window: at most ``batch`` messages are handled but not completed at any time
  (a batch being flushed counts), so a process that dies repeats at most one batch. A handler
  that would make it more waits for the flush (the backlog cap, ``_full``);
* session order: a message waiting here keeps its lock, so the queue hands out nothing more of
  its session until it is gone (the receive's line rule);
* a flush that fails (the database unavailable) keeps its messages waiting, locked and renewed,
  for the next one; a handler held by the cap retries with backoff meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from outbox.core.clock import Clock
from outbox.core.errors import ConfigurationError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage

log = logging.getLogger("outbox.queue.consumer")  # the consumer's, as its other lines

#: Longest wait between two tries of a failed flush while a handler waits for room.
MAX_RETRY_WAIT = 1.0


class Completer:
    """Handled messages waiting for their completion, flushed in batches (the module's rules).
    Thread safe: the consumer's handler threads add, any of them or the loop flushes."""

    def __init__(
        self,
        complete_many: Callable[[Sequence[ReceivedMessage]], set[int]],
        settled: Callable[[Sequence[ReceivedMessage]], None],
        clock: Clock,
        *,
        batch: int,
        delay: float,
    ) -> None:
        """``complete_many`` completes a batch and says which sequence numbers went;
        ``settled`` is told of every flushed batch (completed or lost: no longer held)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigurationError(f"complete_batch must be a positive integer, got {batch!r}")
        if not delay >= 0:
            raise ConfigurationError(f"complete_delay must not be negative, got {delay!r}")
        self.batch = batch
        self.delay = timedelta(seconds=delay)
        self.clock = clock
        self.completed = 0  # messages completed by flushes
        self.lost = 0  # messages whose lock was lost before their flush (redelivered)
        self._complete_many = complete_many
        self._settled = settled
        self._lock = threading.Lock()
        self._waiting: list[ReceivedMessage] = []
        self._count = 0  # handled, not yet completed: the waiting and the ones being flushed
        self._since: datetime | None = None  # when the oldest waiting message came
        self._flushing = threading.Lock()  # one flush at a time

    def _full(self) -> bool:
        """A whole batch is handled but not completed: nothing more joins before a flush."""
        return self._count >= self.batch

    def add(self, msg: ReceivedMessage) -> None:
        """``msg``'s handler succeeded: complete it with the next flush. Waits (flushing) while
        a whole batch is handled but not completed; flushes at once when this one fills the
        batch or the oldest has waited ``delay``."""
        wait = 0.05
        while True:
            with self._lock:
                if not self._full():
                    now = self.clock.now()
                    self._waiting.append(msg)
                    self._count += 1
                    if self._since is None:
                        self._since = now
                    due = self._full() or now - self._since >= self.delay
                    break
            if not self.flush():  # the database failed it: try again, not too often
                self.clock.sleep(wait)
                wait = min(wait * 2, MAX_RETRY_WAIT)
        if due:
            self.flush()

    def due(self) -> bool:
        """Has the oldest waiting message waited ``delay``?"""
        with self._lock:
            return self._since is not None and self.clock.now() - self._since >= self.delay

    def __len__(self) -> int:
        """Messages handled and not completed yet (waiting or being flushed)."""
        with self._lock:
            return self._count

    def flush(self) -> bool:
        """Complete every waiting message in one statement (after a flush in progress ends);
        False when the statement failed: logged, and the messages wait for the next flush."""
        with self._flushing:
            with self._lock:
                batch, self._waiting, self._since = self._waiting, [], None
            if not batch:
                return True
            try:
                done = self._complete_many(batch)
            except Exception as e:  # still locked (and renewed): the next flush tries again
                log.warning("could not complete %d handled messages, retrying: %s", len(batch), e)
                with self._lock:
                    self._waiting[:0] = batch
                    if self._since is None:
                        self._since = self.clock.now()
                return False
            self._report(batch, done)
            self._settled(batch)
            with self._lock:
                self._count -= len(batch)
            return True

    def _report(self, batch: Sequence[ReceivedMessage], done: set[int]) -> None:
        self.completed += len(done)
        if len(done) == len(batch):
            return
        for msg in batch:
            if msg.sequence_number not in done:
                self.lost += 1
                log.warning(
                    "message %s: its lock was lost before its completion; it will be "
                    "redelivered (handled once already)",
                    msg.message_id,
                )

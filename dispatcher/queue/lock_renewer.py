"""Keeping peek-locks alive while work runs longer than the lock (Service Bus' AutoLockRenewer).

Both the consumer helper and the ``run-dispatcher`` worker hold messages while they work; if the
work outlives ``lock_duration``, another receiver would get the message and do it again. A
background thread renews each held lock once half its duration has passed, by the injected clock,
so tests move time instead of waiting for it (``renewal.LeaseRenewer``, the mechanism the inbox
and the claim log use for their claims too). What to renew is whatever ``held()`` returns at
each check; ``Unsettled`` is that list for a batch whose messages are settled one by one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING

from dispatcher.queue.renewal import LeaseRenewer, Renewal
from outbox.core import telemetry
from outbox.core.clock import Clock
from outbox.core.errors import OutboxError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.queue.ports import QueueReceiver

log = logging.getLogger("outbox.queue")


class Unsettled:
    """Received messages not settled yet, by sequence number; calling it lists them (the
    ``held`` of a ``LockRenewer``). Thread-safe: handlers settle from their own threads.

    The one tracker of both holders: the consumer helper adds each batch as it arrives, the
    worker's command handler starts one per batch (``received``) and clears it when the batch
    ends, settled or not, so no renewer keeps those locks any longer."""

    def __init__(self, received: Iterable[ReceivedMessage] = ()) -> None:
        self._lock = threading.Lock()
        self._messages: dict[int, ReceivedMessage] = {m.sequence_number: m for m in received}

    def __call__(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self._messages.values())

    def add(self, received: Iterable[ReceivedMessage]) -> None:
        with self._lock:
            self._messages.update((m.sequence_number, m) for m in received)

    def pop(self, msg: ReceivedMessage) -> None:
        with self._lock:
            self._messages.pop(msg.sequence_number, None)

    def discard(self, done: Iterable[ReceivedMessage]) -> None:
        """Let go of these deliveries, each only if it is still the one held under its number
        (a redelivery of the number, received after this one's lock was lost, stays held)."""
        with self._lock:
            for m in done:
                if self._messages.get(m.sequence_number) is m:
                    del self._messages[m.sequence_number]

    def clear(self) -> None:
        with self._lock:
            self._messages.clear()


class LockRenewer:
    """``with LockRenewer(queue, held, clock):`` renews the locks ``held()`` returns (a
    ``LeaseRenewer`` that tracks ``held()`` at each look, keyed by sequence number)."""

    def __init__(
        self,
        queue: QueueReceiver,
        held: Callable[[], Iterable[ReceivedMessage]],
        clock: Clock,
        *,
        check_interval: float = 1.0,
    ) -> None:
        self.queue = queue
        self.held = held
        self.clock = clock
        self.check_interval = check_interval
        self._messages: dict[int, ReceivedMessage] = {}  # the last look's: only its thread
        self._renewer: LeaseRenewer[int] = LeaseRenewer(
            self._renew,
            clock,
            queue.lock_duration,
            name="outbox-lock-renewer",
            check_interval=check_interval,
            track=self._track,
        )
        self._running = ExitStack()

    @property
    def renewals(self) -> int:
        """Locks renewed so far."""
        return self._renewer.renewals

    def __enter__(self) -> LockRenewer:
        self._running.enter_context(self._renewer.renewing())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._running.close()

    def _track(self) -> list[tuple[int, datetime | None]]:
        self._messages = {m.sequence_number: m for m in self.held()}
        return [(seq, m.locked_until) for seq, m in self._messages.items()]

    def _renew(self, seq: int, now: datetime) -> datetime | Renewal:
        msg = self._messages[seq]
        try:
            until = self.queue.renew_lock(msg)
        except OutboxError as e:  # lost or settled meanwhile: nothing more to keep
            log.warning("could not renew the lock of %s: %s", msg.message_id, e)
            return Renewal.LOST
        telemetry.instrument(
            "counter", "outbox.lock.renewals", "{renewal}", "message locks renewed"
        ).add(1)
        return until

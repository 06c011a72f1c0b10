"""Keeping peek-locks alive while work runs longer than the lock (Service Bus' AutoLockRenewer).

Both the consumer helper and the ``run-dispatcher`` worker hold messages while they work; if the
work outlives ``lock_duration``, another receiver would get the message and do it again. A
background thread renews each held lock once half its duration has passed, by the injected clock,
so tests move time instead of waiting for it. What to renew is whatever ``held()`` returns at
each check; ``Unsettled`` is that list for a batch whose messages are settled one by one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING

from outbox.core import telemetry
from outbox.core.clock import Clock
from outbox.core.errors import OutboxError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.queue.ports import QueueReceiver

log = logging.getLogger("outbox.queue")


class Unsettled:
    """Received messages not settled yet, by sequence number; calling it lists them (the
    ``held`` of a ``LockRenewer``). Thread-safe: handlers settle from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: dict[int, ReceivedMessage] = {}

    def __call__(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self._messages.values())

    def add(self, received: Iterable[ReceivedMessage]) -> None:
        with self._lock:
            self._messages.update((m.sequence_number, m) for m in received)

    def pop(self, msg: ReceivedMessage) -> None:
        with self._lock:
            self._messages.pop(msg.sequence_number, None)


class LockRenewer:
    """``with LockRenewer(queue, held, clock):`` renews the locks ``held()`` returns."""

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
        self.renewals = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="outbox-lock-renewer", daemon=True)

    def __enter__(self) -> LockRenewer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        expiries: dict[int, datetime] = {}
        half = self.queue.lock_duration / 2
        while not self._done.wait(self.check_interval):
            now = self.clock.now()
            for msg in list(self.held()):
                until = expiries.get(msg.sequence_number, msg.locked_until)
                if until is None or until - now > half:
                    continue
                try:
                    expiries[msg.sequence_number] = self.queue.renew_lock(msg)
                    self.renewals += 1
                    telemetry.instrument(
                        "counter", "outbox.lock.renewals", "{renewal}", "message locks renewed"
                    ).add(1)
                except OutboxError as e:  # lost or settled meanwhile: nothing more to keep
                    log.warning("could not renew the lock of %s: %s", msg.message_id, e)
                    expiries.pop(msg.sequence_number, None)

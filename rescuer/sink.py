"""Where rescue commands go: the durable SQL command queue, the Service Bus command queue
(``command_transport = "servicebus"``), or a list in tests.

Why a small protocol of our own: a pass only needs "enqueue these, tell me how many were new".
The queue's duplicate detection on ``message_id`` (= the command id from (table, id, last_seq))
is what makes a repeated pass, or a pass re-run after a crash before its checkpoint, enqueue
nothing new.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from dispatcher.commands import ProcessDocument

if TYPE_CHECKING:
    from dispatcher.queue.ports import QueueSender
    from outbox.core.clock import Clock
    from outbox.core.settings import Settings

#: Commands per queue transaction: big enough to amortize the commit, small enough to keep
#: SQLite's write lock short.
BATCH = 500


class CommandSink(Protocol):
    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        """Enqueue durably; returns how many were new (duplicates by command id are dropped)."""
        ...


class InMemorySink:
    """Commands in a list, deduplicated by command id like the SQL queue."""

    def __init__(self) -> None:
        self.commands: list[ProcessDocument] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.fail_next: BaseException | None = None  # test hook: raise on the next enqueue

    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        with self._lock:
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            new = 0
            for c in commands:
                if c.command_id in self._seen:
                    continue
                self._seen.add(c.command_id)
                self.commands.append(c)
                new += 1
            return new


class QueueSink:
    """``ProcessDocument`` commands into the command queue (``settings.command_queue``): SQL, or
    Service Bus, where duplicate detection on the command id drops repeats the same way."""

    def __init__(self, queue: QueueSender, queue_name: str) -> None:
        self.queue = queue  # a SqlQueue, or its .sender
        self.queue_name = queue_name

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Clock | None = None) -> QueueSink:
        if settings.command_transport == "servicebus":
            from dispatcher.transports.servicebus_queue import ServiceBusCommandQueue

            sb = ServiceBusCommandQueue.from_settings(settings, clock=clock)
            return cls(sb, settings.command_queue)
        from dispatcher.queue.sql_queue import SqlQueue

        return cls(SqlQueue.from_settings(settings, clock=clock), settings.command_queue)

    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        new = 0
        for i in range(0, len(commands), BATCH):
            chunk = commands[i : i + BATCH]
            sent = self.queue.send(self.queue_name, [c.to_queue_message() for c in chunk])
            new += len(sent)
        return new

    def close(self) -> None:
        self.queue.close()

"""Where rescue commands go: the command queue the settings choose (``outbox.wiring`` builds the
``QueueSink`` over it), or a list in tests.

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

    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        with self._lock:
            new = 0
            for c in commands:
                if c.command_id in self._seen:
                    continue
                self._seen.add(c.command_id)
                self.commands.append(c)
                new += 1
            return new


class QueueSink:
    """``ProcessDocument`` commands into a command queue (the SQL queue, or Service Bus, whose
    duplicate detection on the command id drops repeats the same way)."""

    def __init__(self, queue: QueueSender, queue_name: str) -> None:
        self.queue = queue  # a SqlQueue, or its .sender
        self.queue_name = queue_name

    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        new = 0
        for i in range(0, len(commands), BATCH):
            chunk = commands[i : i + BATCH]
            sent = self.queue.send(self.queue_name, [c.to_queue_message() for c in chunk])
            new += len(sent)
        return new

    def close(self) -> None:
        self.queue.close()

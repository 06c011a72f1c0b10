"""The command queue's dead-letter subqueue on Service Bus: list, show, requeue and purge, with the
selection of the SQL queue (``DeadLetterSelection``: ids, a ``where`` filter, or ``all``).

A dead letter's id is its sequence number in the subqueue. A requeued command goes back under a
derived id ``<id>+r<sequence number>`` (carrying the original id, which the worker reports), not
under its own: the original id may still be inside the duplicate-detection window, where Service
Bus would silently drop it. Its delivery count starts again at 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from dispatcher.queue.messages import DeadLetter, QueueMessage
from dispatcher.queue.selection import DeadLetterSelection
from dispatcher.servicebus.commands import PROP_ORIGINAL_ID, derived_id, to_dead_letter
from outbox.core.errors import MessageNotFoundError

PAGE = 100


class DeadLetterQueue:
    """The dead-letter subqueue of a queue on ``client``; ``send(queue, message, extra)`` puts a
    requeued message back (the command queue's own send, with extra application properties)."""

    def __init__(
        self,
        sb: ModuleType,
        client: Callable[[], Any],
        send: Callable[[str, QueueMessage, Mapping[str, Any]], None],
        max_wait_time: float,
    ) -> None:
        self.sb = sb
        self.client = client
        self.send = send
        self.max_wait_time = max_wait_time

    def _receiver(self, queue: str) -> Any:
        return self.client().get_queue_receiver(
            queue_name=queue,
            sub_queue=self.sb.ServiceBusSubQueue.DEAD_LETTER,
            max_wait_time=self.max_wait_time,
        )

    def _peek_all(self, queue: str) -> Iterator[tuple[Any, DeadLetter]]:
        receiver = self._receiver(queue)
        try:
            start = 0
            while True:
                page = receiver.peek_messages(max_message_count=PAGE, sequence_number=start)
                if not page:
                    return
                for m in page:
                    yield m, to_dead_letter(queue, m)
                start = int(page[-1].sequence_number) + 1
        finally:
            receiver.close()

    def list(
        self, queue: str, limit: int, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        selection = DeadLetterSelection.of(where=where) if where else DeadLetterSelection(all=True)
        out = []
        for _, dl in self._peek_all(queue):
            if selection.matches(dl):
                out.append(dl)
                if len(out) >= limit:
                    break
        return out

    def get(self, queue: str, dead_letter_id: int) -> DeadLetter:
        receiver = self._receiver(queue)
        try:
            page = receiver.peek_messages(max_message_count=1, sequence_number=dead_letter_id)
        finally:
            receiver.close()
        if not page or int(page[0].sequence_number) != dead_letter_id:
            raise MessageNotFoundError(f"no dead letter {dead_letter_id} on {queue!r}")
        return to_dead_letter(queue, page[0])

    def count(self, queue: str, selection: DeadLetterSelection) -> int:
        return sum(1 for _, dl in self._peek_all(queue) if selection.matches(dl))

    def move(
        self,
        queue: str,
        selection: DeadLetterSelection,
        *,
        on_progress: Callable[[int], None] | None,
        requeue: bool,
    ) -> int:
        """Requeue (or purge) the selected dead letters; the others are released untouched.

        The others stay locked while the pages are read (so a page never returns them again)
        and are abandoned at the end, rather than left locked until their locks expire."""
        moved = 0
        skipped: list[Any] = []
        receiver = self._receiver(queue)
        try:
            while True:
                page = receiver.receive_messages(
                    max_message_count=PAGE, max_wait_time=self.max_wait_time
                )
                if not page:
                    break
                done = 0
                for m in page:
                    dl = to_dead_letter(queue, m)
                    if not selection.matches(dl):
                        skipped.append(m)
                        continue
                    if requeue:
                        copy = QueueMessage(
                            body=dl.body,
                            message_id=derived_id(dl.message_id, f"r{dl.id}"),
                            session_id=dl.session_id,
                            subject=dl.subject,
                            content_type=dl.content_type or "application/octet-stream",
                            correlation_id=dl.correlation_id,
                            headers=dict(dl.headers),
                        )
                        self.send(queue, copy, {PROP_ORIGINAL_ID: dl.message_id})
                    receiver.complete_message(m)
                    done += 1
                moved += done
                if done and on_progress is not None:
                    on_progress(done)
        finally:
            for m in skipped:
                with contextlib.suppress(Exception):  # its lock expires anyway
                    receiver.abandon_message(m)
            with contextlib.suppress(Exception):
                receiver.close()
        return moved

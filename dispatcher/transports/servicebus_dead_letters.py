"""The command queue's dead-letter subqueue on Service Bus: list, show, requeue and purge, with the
selection rules of the SQL queue (ids, a ``where`` filter, or ``all``).

A dead letter's id is its sequence number in the subqueue. A requeued command goes back under a
derived id ``<id>+r<sequence number>`` (carrying the original id, which the worker reports), not
under its own: the original id may still be inside the duplicate-detection window, where Service
Bus would silently drop it. Its delivery count starts again at 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.queue.messages import DeadLetter, QueueMessage
from outbox.core.clock import utc
from outbox.core.errors import MessageNotFoundError, ValidationError

if TYPE_CHECKING:
    from dispatcher.transports.servicebus_queue import ServiceBusCommandQueue

FILTERS = ("queue", "reason", "session_id", "message_id", "subject")
PAGE = 100


def check_selection(ids: Sequence[int] | None, where: Mapping[str, str] | None, all: bool) -> None:
    if sum((ids is not None, where is not None, bool(all))) != 1:
        raise ValidationError("give exactly one of: ids, where=..., all=True")
    for key in where or {}:
        if key not in FILTERS:
            raise ValidationError(
                f"cannot filter dead letters by {key!r}", hint=f"use one of {', '.join(FILTERS)}"
            )


class DeadLetterQueue:
    def __init__(self, owner: ServiceBusCommandQueue) -> None:
        self.owner = owner

    def _receiver(self, queue: str) -> Any:
        sb = self.owner._sb
        return self.owner.client().get_queue_receiver(
            queue_name=queue,
            sub_queue=sb.ServiceBusSubQueue.DEAD_LETTER,
            max_wait_time=self.owner.max_wait_time,
        )

    def to_dead_letter(self, queue: str, m: Any) -> DeadLetter:
        from dispatcher.transports.servicebus_queue import (
            _OURS,
            PROP_NO_SESSION,
            PROP_ORIGINAL_ID,
            PROP_PRIOR_DELIVERIES,
            _text,
        )

        props = {_text(k): _text(v) for k, v in (m.application_properties or {}).items()}
        body = m.body if isinstance(m.body, bytes) else b"".join(m.body)
        return DeadLetter(
            id=int(m.sequence_number),
            queue=queue,
            message_id=str(props.get(PROP_ORIGINAL_ID) or m.message_id),
            session_id=None if props.get(PROP_NO_SESSION) else m.session_id,
            body=body,
            subject=m.subject or "",
            content_type=m.content_type or "",
            correlation_id=m.correlation_id,
            headers={k: v for k, v in props.items() if k not in _OURS},
            enqueued_at=utc(m.enqueued_time_utc),
            sequence_number=int(m.sequence_number),
            delivery_count=int(props.get(PROP_PRIOR_DELIVERIES) or 0)
            + int(m.delivery_count or 0)
            + 1,
            reason=m.dead_letter_reason or "",
            description=m.dead_letter_error_description or "",
            # Service Bus keeps no dead-lettering time; the enqueue time is the nearest it has.
            dead_lettered_at=utc(m.enqueued_time_utc),
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
                    yield m, self.to_dead_letter(queue, m)
                start = int(page[-1].sequence_number) + 1
        finally:
            receiver.close()

    @staticmethod
    def matches(dl: DeadLetter, ids: Sequence[int] | None, where: Mapping[str, str] | None) -> bool:
        if ids is not None:
            return dl.id in ids
        return all(str(getattr(dl, k)) == v for k, v in (where or {}).items())

    def list(
        self, queue: str, limit: int, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        if where:
            check_selection(None, where, False)
        out = []
        for _, dl in self._peek_all(queue):
            if self.matches(dl, None, where):
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
        return self.to_dead_letter(queue, page[0])

    def count(
        self,
        queue: str,
        ids: Sequence[int] | None,
        *,
        where: Mapping[str, str] | None,
        all: bool,
    ) -> int:
        check_selection(ids, where, all)
        return sum(1 for _, dl in self._peek_all(queue) if self.matches(dl, ids, where))

    def move(
        self,
        queue: str,
        ids: Sequence[int] | None,
        *,
        where: Mapping[str, str] | None,
        all: bool,
        on_progress: Callable[[int], None] | None,
        requeue: bool,
    ) -> int:
        """Requeue (or purge) the selected dead letters; the others are released untouched."""
        from dispatcher.transports.servicebus_queue import PROP_ORIGINAL_ID, derived_id

        check_selection(ids, where, all)
        moved = 0
        receiver = self._receiver(queue)
        try:
            while True:
                page = receiver.receive_messages(
                    max_message_count=PAGE, max_wait_time=self.owner.max_wait_time
                )
                if not page:
                    break
                done = 0
                for m in page:
                    dl = self.to_dead_letter(queue, m)
                    if not self.matches(dl, ids, where):
                        continue  # stays locked by this receiver until it closes
                    if requeue:
                        copy = QueueMessage(
                            body=dl.body,
                            message_id=derived_id(dl.message_id, 0).replace("+0", f"+r{dl.id}"),
                            session_id=dl.session_id,
                            subject=dl.subject,
                            content_type=dl.content_type or "application/octet-stream",
                            correlation_id=dl.correlation_id,
                            headers=dict(dl.headers),
                        )
                        sdk_copy = self.owner._to_sdk(copy, extra={PROP_ORIGINAL_ID: dl.message_id})
                        self.owner._send_sdk(queue, [sdk_copy])
                    receiver.complete_message(m)
                    done += 1
                moved += done
                if done and on_progress is not None:
                    on_progress(done)
        finally:
            with contextlib.suppress(Exception):
                receiver.close()
        return moved

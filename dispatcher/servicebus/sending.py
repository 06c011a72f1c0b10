"""Sending to the Service Bus command queue, the first role of ``ServiceBusCommandQueue`` and its
base: the SDK client, the clock and the queue's open/closed state, which the other roles share.

One ``send`` is one SDK batch (atomic on one entity). Service Bus reports a dropped duplicate as a
success, so ``send`` returns every id it was given. An SDK sender is not thread-safe: each queue's
sender has its own lock, and a sender that failed is closed and opened again on the next send.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.queue import validation
from dispatcher.queue.messages import QueueMessage
from dispatcher.servicebus import errors, sdk
from dispatcher.servicebus.commands import to_sdk
from outbox.core.clock import SystemClock
from outbox.core.errors import ClosedError, ValidationError

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from dispatcher.servicebus.options import ServiceBusQueueOptions


class CommandSending:
    """``QueueSender`` on a session-enabled Service Bus queue (see ``ServiceBusCommandQueue``)."""

    def __init__(self, client: Any, options: ServiceBusQueueOptions) -> None:
        self._sb, self._errors = sdk.load()
        self._client = client
        self.options = options
        self.clock = options.clock or SystemClock()
        self.max_body_bytes = options.max_body_bytes
        self.max_wait_time = options.max_wait_time
        #: guards the senders, the closed flag, and the client while it opens a receiver
        self._lock = threading.Lock()
        self._senders: dict[str, tuple[Any, threading.Lock]] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the Service Bus command queue is closed")

    def unavailable(self, what: str, e: Exception) -> Exception:
        """An SDK failure as ours: a missing entity is a configuration error, the rest retryable."""
        return errors.unavailable(self._errors, what, e)

    def validate(self, queue: str, msg: QueueMessage) -> None:
        validation.queue_name(queue)
        validation.identifier("message_id", msg.message_id)
        validation.identifier("session_id", msg.session_id, optional=True)
        validation.body(msg.body, msg.message_id, self.max_body_bytes)

    def _to_sdk(self, msg: QueueMessage, *, extra: Mapping[str, Any] | None = None) -> Any:
        return to_sdk(self._sb, msg, extra=extra)

    def send(
        self,
        queue: str,
        messages: QueueMessage | Sequence[QueueMessage],
        *,
        conn: Connection | None = None,
    ) -> list[str]:
        """Send one message or one batch (atomic on the entity); returns every id given, as
        Service Bus does not say which ones duplicate detection dropped."""
        self._check_open()
        if conn is not None:
            raise ValidationError(
                "Service Bus cannot join a SQL transaction (conn=...)",
                hint="send after the transaction commits; duplicate detection drops repeats",
            )
        batch = [messages] if isinstance(messages, QueueMessage) else list(messages)
        for m in batch:
            self.validate(queue, m)
        if not batch:
            return []
        self._send_sdk(queue, [self._to_sdk(m) for m in batch])
        return [m.message_id for m in batch]

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Connection | None = None
    ) -> list[str]:
        """Per queue, in order; not atomic across queues (Service Bus has no such batch)."""
        sent: list[str] = []
        by_queue: dict[str, list[QueueMessage]] = {}
        for queue, m in entries:
            by_queue.setdefault(queue, []).append(m)
        for queue, batch in by_queue.items():
            sent += self.send(queue, batch, conn=conn)
        return sent

    def _sender(self, queue: str) -> tuple[Any, threading.Lock]:
        with self._lock:
            if queue not in self._senders:
                self._senders[queue] = (
                    self._client.get_queue_sender(queue_name=queue),
                    threading.Lock(),
                )
            return self._senders[queue]

    def _send_sdk(self, queue: str, sdk_messages: list[Any]) -> None:
        sender, lock = self._sender(queue)
        try:
            with lock:  # an SDK sender is not thread-safe
                sender.send_messages(sdk_messages)
        except Exception as e:
            with self._lock:
                self._senders.pop(queue, None)
            with contextlib.suppress(Exception):
                sender.close()
            raise self.unavailable(f"cannot send to Service Bus queue {queue!r}", e) from e

    def _close_senders(self) -> list[Any] | None:
        """Mark the queue closed; the senders to close (None: it was closed already)."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            senders = [s for s, _ in self._senders.values()]
            self._senders.clear()
        return senders

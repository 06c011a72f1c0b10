"""The embedded transport: outbox messages go into the SQL queue, one atomic send per batch.

Each ``TransportMessage`` maps onto a ``QueueMessage`` field for field (destination -> queue,
scheduled_at -> not_before). A batch is one transaction, so "send returned" means every message
is committed; a re-sent batch is dropped by the queue's duplicate detection on message_id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.errors import (
    ClosedError,
    OutboxError,
    PermanentTransportError,
    RetryableTransportError,
    TransportUnavailableError,
    ValidationError,
)

log = logging.getLogger("outbox.dispatcher")


class SqlQueueTransport:
    """A ``Transport`` over ``SqlQueue``."""

    #: One ``send`` is one database transaction: the batch is stored whole or not at all.
    atomic_batches = True

    def __init__(self, queue: SqlQueue) -> None:
        self.queue = queue

    def send(self, batch: Sequence[TransportMessage]) -> None:
        entries = [(m.destination, self._convert(m)) for m in batch]
        if not entries:
            return
        try:
            # validates every message once, and each distinct destination once (a queue name)
            self.queue.send_batch(entries)
        except ValidationError as e:
            culprit = self._culprit(entries) or batch[0].message_id
            raise PermanentTransportError(f"message {culprit}: {e}", message_id=culprit) from e
        except ClosedError as e:  # shutting down: the message waits for a command or the rescuer
            raise RetryableTransportError(
                f"cannot send message {batch[0].message_id}: {e}",
                message_id=batch[0].message_id,
            ) from e
        except OutboxError as e:
            ids = ", ".join(m.message_id for m in batch[:3]) + ("..." if len(batch) > 3 else "")
            raise TransportUnavailableError(
                f"the SQL queue did not take the batch ({ids}): {e}",
                message_id=batch[0].message_id,
            ) from e

    def _culprit(self, entries: Sequence[tuple[str, QueueMessage]]) -> str | None:
        """The first message the queue refuses (only looked for once a batch was refused)."""
        for queue, qm in entries:
            try:
                self.queue.validate(queue, qm)
            except ValidationError:
                return qm.message_id
        return None

    @staticmethod
    def _convert(m: TransportMessage) -> QueueMessage:
        return QueueMessage(
            body=m.body,
            message_id=m.message_id,
            session_id=m.session_id,
            not_before=m.scheduled_at,
            subject=m.subject,
            content_type=m.content_type,
            correlation_id=m.correlation_id,
            headers=m.headers,  # the sender only reads them (no copy per message)
        )

    def close(self) -> None:
        """The queue belongs to whoever built it (the runtime shares it with the command worker)."""


class ReachableSqlTransport:
    """The SQL transport, built when its database answers, so writes never depend on the queue
    database being up: ``Outbox.open`` and every commit succeed while it is down (each dispatch
    fails retryably, is logged and counted, and the rescuer delivers later). A database that
    answers but is wrong (not migrated) still fails at once."""

    atomic_batches = True

    def __init__(self, queue_factory: Callable[[], SqlQueue]) -> None:
        self._factory = queue_factory
        self._inner: Transport | None = None
        try:
            self._build()
        except OutboxError as e:
            if not e.retryable:
                raise
            log.warning(
                "the queue database is unreachable (%s); commits go on, and the rescuer "
                "delivers their messages once it is back",
                e,
            )

    def _build(self) -> Transport:
        if self._inner is None:
            self._inner = SqlQueueTransport(self._factory())
        return self._inner

    def send(self, batch: Sequence[TransportMessage]) -> None:
        try:
            inner = self._build()
        except OutboxError as e:
            if not batch:
                return
            raise TransportUnavailableError(
                f"the SQL queue is not reachable: {e}", message_id=batch[0].message_id
            ) from e
        inner.send(batch)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

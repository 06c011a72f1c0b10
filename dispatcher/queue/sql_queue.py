"""``SqlQueue``: a durable queue in SQL with Service Bus semantics (duplicate detection, scheduled
delivery, session FIFO with one lock holder per session, peek-lock settlement, delivery counts and
dead letters), as one convenient object.

It is a facade over three parts, one per port of ``dispatcher.queue.ports``: ``sender``
(``SqlQueueSender``), ``receiver`` (``SqlQueueReceiver``) and ``admin``
(``SqlQueueAdministration``). They share one ``Database`` (engine, transactions, error
translation) and one ``QueueOptions``; how each stays correct under concurrency is told in its own
module. Every time comes from the injected clock and is stored as UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine

from dispatcher.queue.admin import SqlQueueAdministration
from dispatcher.queue.database import Database, open_engine
from dispatcher.queue.messages import (
    DeadLetter,
    PeekedMessage,
    QueueMessage,
    QueueStats,
    ReceivedMessage,
)
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.ports import DEDUP_CLEANUP_LIMIT, Settleable
from dispatcher.queue.receiver import MAX_DELIVERY_REASON, SqlQueueReceiver
from dispatcher.queue.sender import SqlQueueSender
from outbox.core.clock import Clock
from outbox.core.errors import QueueError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

__all__ = ["DEDUP_CLEANUP_LIMIT", "MAX_DELIVERY_REASON", "Settleable", "SqlQueue"]


class SqlQueue:
    """A set of named queues in one SQL database (SQLite file or PostgreSQL).

    Queues need no creation: the first send to a valid name creates it. The instance is thread
    safe; use one per process and share it. It is a ``QueueSender``, a ``QueueReceiver`` and a
    ``QueueAdministration`` at once; pass ``queue.sender`` (etc.) where one role is enough.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        clock: Clock | None = None,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        duplicate_detection_window: float = 600.0,
        max_body_bytes: int = 256 * 1024,
        check_schema: bool = True,
        pool_size: int | None = None,
    ) -> None:
        self._options = QueueOptions.checked(
            clock=clock,
            lock_duration=lock_duration,
            max_delivery_count=max_delivery_count,
            duplicate_detection_window=duplicate_detection_window,
            max_body_bytes=max_body_bytes,
        )
        if isinstance(url_or_engine, str):
            self._db = Database(open_engine(url_or_engine, pool_size=pool_size), owned=True)
        else:
            self._db = Database(url_or_engine, owned=False)
        self.admin = SqlQueueAdministration(self._db, self._options)
        self.receiver = SqlQueueReceiver(self._db, self._options)
        # A committed send prunes expired duplicate ids when due (at most every half window).
        self.sender = SqlQueueSender(
            self._db, self._options, after_commit=self.admin.maybe_forget_expired_duplicates
        )
        if check_schema:
            self._check_schema()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, clock: Clock | None = None, pool_size: int | None = None
    ) -> SqlQueue:
        """A queue configured from ``outbox.core.settings.Settings``."""
        return cls(
            settings.sql_url,
            clock=clock,
            lock_duration=settings.lock_duration,
            max_delivery_count=settings.max_delivery_count,
            duplicate_detection_window=settings.duplicate_detection_window,
            max_body_bytes=settings.max_message_bytes,
            pool_size=pool_size,
        )

    def ensure_pool_size(self, size: int) -> None:
        """Grow the connection pool to at least ``size`` (for a queue built from a URL; an engine
        passed in is the caller's). Calls in progress finish on their connections."""
        if not self._db.owned:
            return
        current = getattr(self._db.engine.pool, "size", None)
        if not callable(current) or current() >= size:
            return
        old = self._db.engine
        self._db.engine = open_engine(old.url.render_as_string(hide_password=False), pool_size=size)
        old.dispose()

    @property
    def engine(self) -> Engine:
        """The engine, for a consumer handler's own SQL work in the same transaction."""
        return self._db.engine

    @property
    def database(self) -> Database:
        return self._db

    def _check_schema(self) -> None:
        from migrations.sql import current_revision, head_revision

        revision = current_revision(self._db.engine)
        if revision != head_revision():
            state = "is not migrated" if revision is None else f"is at revision {revision}"
            raise QueueError(
                f"the queue database {self._db.engine.url.render_as_string(hide_password=True)} "
                f"{state}; this version needs {head_revision()}",
                hint="run `outbox migrate`",
            )

    # --- settings, shared by the three parts (assignable, as before the split) -------------

    @property
    def clock(self) -> Clock:
        return self._options.clock

    @clock.setter
    def clock(self, value: Clock) -> None:
        self._options.clock = value

    @property
    def lock_duration(self) -> timedelta:
        return self._options.lock_duration

    @lock_duration.setter
    def lock_duration(self, value: timedelta) -> None:
        self._options.lock_duration = value

    @property
    def max_delivery_count(self) -> int:
        return self._options.max_delivery_count

    @max_delivery_count.setter
    def max_delivery_count(self, value: int) -> None:
        self._options.max_delivery_count = value

    @property
    def duplicate_detection_window(self) -> timedelta:
        return self._options.duplicate_detection_window

    @duplicate_detection_window.setter
    def duplicate_detection_window(self, value: timedelta) -> None:
        self._options.duplicate_detection_window = value

    @property
    def max_body_bytes(self) -> int:
        return self._options.max_body_bytes

    @max_body_bytes.setter
    def max_body_bytes(self, value: int) -> None:
        self._options.max_body_bytes = value

    # --- QueueSender -------------------------------------------------------------------------

    def send(
        self,
        queue: str,
        messages: QueueMessage | Sequence[QueueMessage],
        *,
        conn: Connection | None = None,
    ) -> list[str]:
        """Store one message or an atomic batch; returns the ids enqueued (see ``QueueSender``)."""
        return self.sender.send(queue, messages, conn=conn)

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Connection | None = None
    ) -> list[str]:
        """Like ``send`` but each message names its queue; the whole batch is one transaction."""
        return self.sender.send_batch(entries, conn=conn)

    def validate(self, queue: str, msg: QueueMessage) -> None:
        """Raise ``ValidationError`` if ``send(queue, msg)`` would refuse the message."""
        self.sender.validate(queue, msg)

    # --- QueueReceiver -----------------------------------------------------------------------

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Lock and return up to ``max_messages`` deliverable messages (peek-lock)."""
        return self.receiver.receive(queue, max_messages, session_id=session_id)

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Remove and return messages at once: lost if the caller then fails (low-value data)."""
        return self.receiver.receive_and_delete(queue, max_messages, session_id=session_id)

    def complete(self, target: Settleable) -> None:
        """Remove a locked message: it was handled."""
        self.receiver.complete(target)

    def abandon(self, target: Settleable, delay: float = 0) -> None:
        """Release the lock so the message is delivered again, after ``delay`` seconds."""
        self.receiver.abandon(target, delay)

    def dead_letter(self, target: Settleable, reason: str, description: str = "") -> None:
        """Move a locked message to dead letters with a reason (a poison message)."""
        self.receiver.dead_letter(target, reason, description)

    def renew_lock(self, target: Settleable) -> datetime:
        """Extend the lock by ``lock_duration`` from now; returns the new expiry."""
        return self.receiver.renew_lock(target)

    def defer(self, target: Settleable) -> None:
        """Set a locked message aside: only ``receive_deferred`` brings it back."""
        self.receiver.defer(target)

    def receive_deferred(
        self,
        queue: str,
        sequence_numbers: int | Sequence[int],
        *,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Lock and return deferred messages by sequence number (see ``DeferringReceiver``)."""
        return self.receiver.receive_deferred(queue, sequence_numbers, session_id=session_id)

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        """Messages in sequence (FIFO) order, without locking or removing them (``deferred``:
        only the deferred ones)."""
        return self.receiver.peek(queue, limit, deferred=deferred)

    # --- QueueAdministration -----------------------------------------------------------------

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Depth per queue (or of ``queue`` only): active, scheduled, locked and dead-lettered."""
        return self.admin.stats(queue)

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        """Dead letters, oldest first, optionally of one queue and matching ``where``."""
        return self.admin.list_dead_letters(queue, limit, where=where)

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        return self.admin.get_dead_letter(dead_letter_id)

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        """How many dead letters a requeue or purge with these arguments would touch."""
        return self.admin.count_dead_letters(ids, where=where, all=all)

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Put dead letters back on their queues (ids, a ``where`` filter, or ``all=True``)."""
        return self.admin.requeue(ids, where=where, all=all, on_progress=on_progress)

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete dead letters for good (same selection as ``requeue``). Returns how many."""
        return self.admin.purge(ids, where=where, all=all, on_progress=on_progress)

    def forget_expired_duplicates(self, limit: int | None = DEDUP_CLEANUP_LIMIT) -> int:
        """Delete up to ``limit`` (None: all) expired duplicate-detection ids; returns how many."""
        return self.admin.forget_expired_duplicates(limit)

    def maybe_forget_expired_duplicates(self) -> int:
        """Prune expired duplicate-detection ids when due (half a window); never raises."""
        return self.admin.maybe_forget_expired_duplicates()

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections; any later call raises ``ClosedError``."""
        self._db.close()

    def __enter__(self) -> SqlQueue:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

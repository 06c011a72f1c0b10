"""The queue's three roles as typed ports, drawn where Azure Service Bus draws them: a sender, a
receiver and administration.

Why ports: callers that need one role (the rescuer's sink only sends, a consumer only receives and
settles, ``outbox status`` only reads stats) can say so in their types, and a test double or
another broker needs to provide only that role. ``SqlQueue`` satisfies all three; its
``sender``, ``receiver`` and ``admin`` parts satisfy one each.

Optional abilities are documented parts of the protocol rather than extra classes: sessions are
the ``session_id`` argument of ``receive``, joining a caller's transaction is the ``conn``
argument of ``send``.

``close()`` is part of every role, as on Service Bus senders, receivers and the administration
client. The parts of one ``SqlQueue`` share its connection pool, so closing any of them closes the
queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dispatcher.queue.messages import (
    DeadLetter,
    PeekedMessage,
    QueueMessage,
    QueueStats,
    ReceivedMessage,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

#: At most this many expired duplicate-detection ids are deleted per cleanup (a short write).
DEDUP_CLEANUP_LIMIT = 5000

#: What settles a message: the received message itself, or its lock token alone.
Settleable = ReceivedMessage | str


@runtime_checkable
class QueueSender(Protocol):
    """Sends and schedules messages, with duplicate detection on ``message_id``."""

    def send(
        self,
        queue: str,
        messages: QueueMessage | Sequence[QueueMessage],
        *,
        conn: Connection | None = None,
    ) -> list[str]:
        """Store one message or an atomic batch; returns once committed.

        Returns the message ids actually enqueued: an id already seen on this queue within the
        duplicate-detection window is accepted and dropped (as Service Bus does). A message with
        ``not_before`` is scheduled: it is not delivered before that time.

        ``conn`` (optional ability: SQL queues only): send inside that open transaction instead
        (a ``Consumer`` handler's connection), so the messages commit or roll back with the
        handler's work.
        """
        ...

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Connection | None = None
    ) -> list[str]:
        """Like ``send`` but each message names its queue; the whole batch is one transaction."""
        ...

    def validate(self, queue: str, msg: QueueMessage) -> None:
        """Raise ``ValidationError`` if ``send(queue, msg)`` would refuse the message."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class QueueReceiver(Protocol):
    """Receives with peek-lock (or receive-and-delete) and settles what it received.

    Sessions (optional ability): with ``session_id=None`` a receive takes at most one message per
    session, and none of a session whose head is locked; with a ``session_id`` it takes only that
    session's head. Either way a session is delivered in order, to one lock holder at a time.
    """

    @property
    def lock_duration(self) -> timedelta:
        """How long a lock lasts: settle or ``renew_lock`` before it ends."""
        ...

    @property
    def max_delivery_count(self) -> int:
        """Deliveries after which a message goes to dead letters instead."""
        ...

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Lock and return up to ``max_messages`` deliverable messages (peek-lock).

        Messages delivered ``max_delivery_count`` times already go to dead letters instead.
        """
        ...

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Remove and return messages at once: lost if the caller then fails (low-value data)."""
        ...

    def complete(self, target: Settleable) -> None:
        """Remove a locked message: it was handled. ``LockLostError`` if the lock is gone."""
        ...

    def abandon(self, target: Settleable, delay: float = 0) -> None:
        """Release the lock so the message is delivered again, after ``delay`` seconds.

        A message already delivered ``max_delivery_count`` times goes to dead letters instead.
        """
        ...

    def dead_letter(self, target: Settleable, reason: str, description: str = "") -> None:
        """Move a locked message to dead letters with a reason (a poison message)."""
        ...

    def renew_lock(self, target: Settleable) -> datetime:
        """Extend the lock by ``lock_duration`` from now; returns the new expiry."""
        ...

    def peek(self, queue: str, limit: int = 10) -> list[PeekedMessage]:
        """Messages in sequence (FIFO) order, without locking or removing them."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DeferringReceiver(QueueReceiver, Protocol):
    """A receiver with the fourth peek-lock settlement, defer (optional ability; a separate
    protocol so receivers written against ``QueueReceiver`` stay conforming).

    A deferred message stays in the queue but leaves its line: ``receive`` never returns it (and a
    session's later messages go on without it); only ``receive_deferred`` by its sequence number
    does, locked and counted as a delivery like any other, then settled the usual ways. Abandoning
    it, or letting its lock expire, leaves it deferred.
    """

    def defer(self, target: Settleable) -> None:
        """Set a locked message aside; ``LockLostError`` if the lock is gone."""
        ...

    def receive_deferred(
        self,
        queue: str,
        sequence_numbers: int | Sequence[int],
        *,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Lock and return the deferred messages with these sequence numbers, in order.

        ``MessageNotFoundError`` (and nothing locked) when one of them is not a deferred message
        of ``queue`` free to receive. ``session_id``: the session they are in (Service Bus opens
        that session to receive them; the SQL queue only checks it). A message already delivered
        ``max_delivery_count`` times goes to dead letters instead of being returned.
        """
        ...

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        """``QueueReceiver.peek``, deferred messages in state ``deferred``; ``deferred=True``
        shows only those."""
        ...


@runtime_checkable
class QueueAdministration(Protocol):
    """Looks at and tends the queues: depths, dead letters, and housekeeping."""

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Depth per queue (or of ``queue`` only): active, scheduled, locked, deferred and
        dead-lettered.

        Queues that hold nothing (no messages, no dead letters) are not listed."""
        ...

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        """Dead letters, oldest first, optionally of one queue and matching ``where``."""
        ...

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        """One dead letter; ``MessageNotFoundError`` if there is none with that id."""
        ...

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        """How many dead letters a requeue or purge with these arguments would touch."""
        ...

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Put dead letters back on their queues with the same message_id and a delivery count
        of 0. Give ids, a ``where`` filter (queue, reason, session_id, message_id, subject), or
        ``all=True``: exactly one (``selection.DeadLetterSelection.of`` checks them, the same for
        every administration). Returns how many moved."""
        ...

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete dead letters for good (same selection as ``requeue``). Returns how many."""
        ...

    def forget_expired_duplicates(self, limit: int | None = DEDUP_CLEANUP_LIMIT) -> int:
        """Delete up to ``limit`` (None: all) duplicate-detection ids older than the window;
        returns how many."""
        ...

    def maybe_forget_expired_duplicates(self) -> int:
        """``forget_expired_duplicates()`` when it is due; never raises (a failure is logged)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RoutingAdministration(QueueAdministration, Protocol):
    """An administration whose requeue can route and pace (optional ability; a separate
    protocol so administrations written against ``QueueAdministration`` stay conforming, as
    ``DeferringReceiver`` widens ``QueueReceiver``): the SQL queue's. Kafka's and Service Bus's
    dead letters go back where they came from, at the rate their broker takes them."""

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
        to_queue: str | None = None,
        chunk: int | None = None,
    ) -> int:
        """``QueueAdministration.requeue``, into ``to_queue`` instead of each one's own queue
        when given, ``chunk`` dead letters per step (a paced requeue's step, ``Pacer``)."""
        ...

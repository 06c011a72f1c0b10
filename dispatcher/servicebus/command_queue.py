"""Azure Service Bus as the command queue: ``ProcessDocument`` commands sent, received and settled
through the same queue ports the SQL queue implements, so the one worker serves both.

Mapping (docs/servicebus.md, "Service Bus as the command queue"):

* **send**: ``message_id`` = the command id (duplicate detection drops repeats), ``session_id`` =
  the document id, ``not_before`` -> ``scheduled_enqueue_time_utc``. One ``send`` is one SDK batch
  (atomic on one entity). A message without a session goes out as a session of its own (its
  message id), marked so it comes back with ``session_id=None``. Service Bus reports a dropped
  duplicate as a success, so ``send`` returns every id it was given.
* **receive**: one session receiver per message (``NEXT_AVAILABLE_SESSION``, or the named session),
  up to ``max_messages`` sessions at once; the message's lock is its session's lock, renewed with
  ``session.renew_lock()``. Settling closes the session receiver, which releases the session.
* **abandon with a delay**: Service Bus's abandon has no delay and the Python SDK has no
  transactions, so the delayed retry is a *scheduled copy*: renew the session lock (which proves
  we still hold it), schedule a copy under a derived id ``<id>+<deliveries>`` carrying the delivery
  count so far, then complete the original. A crash between the two leaves both; the command is
  idempotent (I6), and a re-run of the same abandon derives the same id, which duplicate detection
  drops. The original id stays in the detection window, so a rescuer resending the command is
  still dropped. Unlike the SQL queue, the session is not held while the copy waits: a later
  command of the same document may run first, which is harmless because every command sends all
  that is pending up to the document's *current* ``last_seq``.
* **defer**: ``defer_message``; ``receive_deferred`` opens a receiver on the message's session
  (remembered from ``defer``, or named by the caller) and calls ``receive_deferred_messages``; one
  deferred message per session at a time, since a received message holds its session until
  settled. Abandoning a deferred message leaves it deferred (no delayed copy). The runtime
  properties have no deferred count: ``stats`` counts deferred messages as active.
* **delivery counts**: the SDK's ``delivery_count`` is the AMQP header (deliveries - 1); ours is
  that + 1 + the count a copy carries. At ``max_delivery_count`` we dead-letter with
  ``MaxDeliveryCountExceeded`` ourselves, as the broker does for an uncopied message.

The class is built up by role, each module adding one to the one below: ``sending``
(``CommandSending``: the client, the closed state, send), ``receiving`` (``CommandReceiving``:
receive, settle, defer, renew, on the table of held messages in ``held``), and here the
administration (depths, the dead-letter subqueue, close). ``connection`` builds the clients from
the environment; the field mapping (``commands``), the dead-letter subqueue (``dead_letters``),
provisioning (``admin``) and the settings every role reads (``options``) live apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Unpack

from dispatcher.queue.messages import DeadLetter, QueueStats
from dispatcher.queue.selection import DeadLetterSelection
from dispatcher.servicebus.connection import connect
from dispatcher.servicebus.dead_letters import DeadLetterQueue
from dispatcher.servicebus.options import ServiceBusQueueKeywords, ServiceBusQueueOptions
from dispatcher.servicebus.receiving import CommandReceiving
from outbox.core.clock import Clock
from outbox.core.errors import ConfigurationError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

__all__ = ["ServiceBusCommandQueue", "connect"]


class ServiceBusCommandQueue(CommandReceiving):
    """``QueueSender`` + ``QueueReceiver`` (+ the administration the worker and CLI need) on a
    session-enabled Service Bus queue. Thread-safe: each held message has its own lock."""

    def __init__(
        self,
        client: Any,
        admin: Any = None,
        *,
        owns_client: bool = False,
        options: ServiceBusQueueOptions | None = None,
        **keywords: Unpack[ServiceBusQueueKeywords],
    ) -> None:
        """``options`` (``ServiceBusQueueOptions``), and any of its fields as a keyword over it;
        ``owns_client``: ``close()`` closes ``client`` too."""
        opts = replace(options or ServiceBusQueueOptions(), **keywords)
        super().__init__(client, opts)
        self._admin = admin
        self.command_queue = opts.command_queue
        self._owns_client = owns_client
        self.dead_letters = DeadLetterQueue(
            self._sb,
            lambda: self._client,
            lambda queue, m, extra: self._send_sdk(queue, [self._to_sdk(m, extra=extra)]),
            opts.max_wait_time,
        )

    @classmethod
    def from_settings(
        cls, settings: Settings, *, clock: Clock | None = None, env: Mapping[str, str] | None = None
    ) -> ServiceBusCommandQueue:
        """The queue ``settings.command_queue`` on the namespace named by the environment
        (``OUTBOX_SERVICEBUS_CONNECTION_STRING``, or ``OUTBOX_SERVICEBUS_NAMESPACE`` with
        azure-identity), or on the clients ``sdk.use_clients`` installed."""
        client, admin = connect(env)
        return cls(
            client,
            admin,
            command_queue=settings.command_queue,
            clock=clock,
            lock_duration=settings.lock_duration,
            max_delivery_count=settings.max_delivery_count,
            max_body_bytes=settings.max_message_bytes,
            owns_client=True,
        )

    # --- administration -------------------------------------------------------------------------

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Depths from the queue's runtime properties (locked messages count as active)."""
        name = queue or self.command_queue
        props = self._runtime_properties(name)
        if props is None:
            return {}
        stats = QueueStats(
            name,
            active=int(props.active_message_count or 0),
            scheduled=int(props.scheduled_message_count or 0),
            dead_lettered=int(props.dead_letter_message_count or 0),
        )
        return {name: stats} if stats.total or stats.dead_lettered else {}

    def depths(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        """``{queue: {state: count}}`` for the ``outbox.queue.messages`` gauge: every count the
        runtime properties give (``QueueRuntimeProperties``), the transfer queues too (messages
        on their way to or from another entity, and those dead-lettered there); an empty queue
        reports zeros, so a dashboard sees it."""
        name = queue or self.command_queue
        props = self._runtime_properties(name)
        if props is None:
            return {}
        fields = {
            "active": "active_message_count",
            "scheduled": "scheduled_message_count",
            "dead_lettered": "dead_letter_message_count",
            "transfer": "transfer_message_count",
            "transfer_dead_lettered": "transfer_dead_letter_message_count",
        }
        return {name: {state: int(getattr(props, f, 0) or 0) for state, f in fields.items()}}

    def _runtime_properties(self, name: str) -> Any:
        """``get_queue_runtime_properties(name)``; None when the queue does not exist."""
        self._check_open()
        if self._admin is None:
            raise ConfigurationError("the Service Bus command queue has no administration client")
        try:
            return self._admin.get_queue_runtime_properties(name)
        except Exception as e:
            if type(e).__name__ == "ResourceNotFoundError":
                return None
            raise self.unavailable(f"cannot read Service Bus queue {name!r}", e) from e

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        return self.dead_letters.list(queue or self.command_queue, limit, where=where)

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        return self.dead_letters.get(self.command_queue, dead_letter_id)

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        return self.dead_letters.count(
            self.command_queue, DeadLetterSelection.of(ids, where=where, all=all)
        )

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        return self.dead_letters.move(
            self.command_queue,
            DeadLetterSelection.of(ids, where=where, all=all),
            on_progress=on_progress,
            requeue=True,
        )

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        return self.dead_letters.move(
            self.command_queue,
            DeadLetterSelection.of(ids, where=where, all=all),
            on_progress=on_progress,
            requeue=False,
        )

    def forget_expired_duplicates(self, limit: int | None = None) -> int:
        """Nothing to do: the broker forgets ids past the window by itself."""
        return 0

    def maybe_forget_expired_duplicates(self) -> int:
        return 0

    def ensure_pool_size(self, size: int) -> None:
        """Nothing to grow: receivers are opened per session."""

    def client(self) -> Any:
        return self._client

    def close(self) -> None:
        """Close the senders, release every session still held, and close an owned client."""
        senders = self._close_senders()
        if senders is None:
            return
        held = self._held.take_all()
        for thing in [*senders, *(h.receiver for h in held)]:
            with contextlib.suppress(Exception):
                thing.close()
        if self._owns_client:
            for c in (self._client, self._admin):
                with contextlib.suppress(Exception):
                    if c is not None:
                        c.close()

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

Why one module: receiving, settling, renewing and the delayed-retry copy all work on one table of
held messages (lock token -> session receiver) under one lock; split, each part would reach into
another's state. The field mapping (``commands``), the dead-letter subqueue
(``dead_letters``) and provisioning (``admin``) live apart.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from dispatcher.queue import validation
from dispatcher.queue.messages import (
    DeadLetter,
    PeekedMessage,
    QueueMessage,
    QueueStats,
    ReceivedMessage,
)
from dispatcher.servicebus import sdk
from dispatcher.servicebus.commands import (
    MAX_DELIVERY_REASON,
    PROP_ORIGINAL_ID,
    PROP_PRIOR_DELIVERIES,
    derived_id,
    to_received,
    to_sdk,
)
from dispatcher.servicebus.dead_letters import DeadLetterQueue
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.errors import (
    ClosedError,
    ConfigurationError,
    LockLostError,
    MessageNotFoundError,
    MissingDependencyError,
    QueueUnavailableError,
    ValidationError,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from outbox.core.settings import Settings


@dataclass
class _Held:
    """One received message: its SDK message, the session receiver that holds it, and ours."""

    receiver: Any
    sdk_message: Any
    received: ReceivedMessage
    original_id: str
    lock: threading.Lock
    deferred: bool = False  # received by receive_deferred: an abandon leaves it deferred


class ServiceBusCommandQueue:
    """``QueueSender`` + ``QueueReceiver`` (+ the administration the worker and CLI need) on a
    session-enabled Service Bus queue. Thread-safe: each held message has its own lock."""

    def __init__(
        self,
        client: Any,
        admin: Any = None,
        *,
        command_queue: str = "outbox-commands",
        clock: Clock | None = None,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        max_body_bytes: int = 256 * 1024,
        max_wait_time: float = 1.0,
        owns_client: bool = False,
    ) -> None:
        self._sb, self._errors = sdk.load()
        self._client = client
        self._admin = admin
        self.command_queue = command_queue
        self.clock = clock or SystemClock()
        self._lock_duration = timedelta(seconds=lock_duration)
        self._max_delivery_count = max_delivery_count
        self.max_body_bytes = max_body_bytes
        self.max_wait_time = max_wait_time
        self._owns_client = owns_client
        self._lock = threading.Lock()
        self._senders: dict[str, tuple[Any, threading.Lock]] = {}
        self._held: dict[str, _Held] = {}
        # sequence number -> Service Bus session of the messages this instance deferred: the
        # service receives a deferred message only through its session
        self._deferred_sessions: dict[int, str] = {}
        self._closed = False
        self.dead_letters = DeadLetterQueue(
            self._sb,
            lambda: self._client,
            lambda queue, m, extra: self._send_sdk(queue, [self._to_sdk(m, extra=extra)]),
            max_wait_time,
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

    # --- the receiver's limits ------------------------------------------------------------------

    @property
    def lock_duration(self) -> timedelta:
        return self._lock_duration

    @property
    def max_delivery_count(self) -> int:
        return self._max_delivery_count

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the Service Bus command queue is closed")

    # --- sending --------------------------------------------------------------------------------

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

    def unavailable(self, what: str, e: Exception) -> Exception:
        """An SDK failure as ours: a missing entity is a configuration error, the rest retryable."""
        if isinstance(e, self._errors.MessagingEntityNotFoundError):
            return ConfigurationError(
                f"{what}: the entity does not exist ({e})",
                hint="run `outbox migrate` to create the command queue",
            )
        if isinstance(e, ValueError | TypeError):  # a refused message: not worth retrying
            return ValidationError(f"{what}: {e}")
        return QueueUnavailableError(f"{what}: {type(e).__name__}: {e}")

    # --- receiving ------------------------------------------------------------------------------

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Lock up to ``max_messages`` sessions (one message each), or the head of one session."""
        self._check_open()
        out: list[ReceivedMessage] = []
        while len(out) < max_messages:
            got = self._receive_one(queue, session_id)
            if got is None:
                break
            out.append(got)
            if session_id is not None:
                break
        return out

    def _receive_one(self, queue: str, session_id: str | None) -> ReceivedMessage | None:
        while True:
            with self._lock:
                receiver = self._client.get_queue_receiver(
                    queue_name=queue,
                    session_id=session_id or self._sb.NEXT_AVAILABLE_SESSION,
                    max_wait_time=self.max_wait_time,
                )
            try:
                got = receiver.receive_messages(
                    max_message_count=1, max_wait_time=self.max_wait_time
                )
            except (
                self._errors.OperationTimeoutError,
                self._errors.SessionCannotBeLockedError,
            ):
                receiver.close()  # no session available (or the named one is held elsewhere)
                return None
            except Exception as e:
                with contextlib.suppress(Exception):
                    receiver.close()
                raise self.unavailable(f"cannot receive from Service Bus queue {queue!r}", e) from e
            if not got:
                receiver.close()
                return None
            held = self._hold(queue, receiver, got[0])
            if held.received.delivery_count <= self.max_delivery_count:
                return held.received
            # A copy that carries its deliveries can go past the limit: dead-letter it, as the
            # broker would have done had it stayed one message, and look for the next one.
            with contextlib.suppress(LockLostError):
                self.dead_letter(
                    held.received,
                    MAX_DELIVERY_REASON,
                    f"delivered {held.received.delivery_count - 1} times",
                )

    def _hold(self, queue: str, receiver: Any, m: Any) -> _Held:
        locked_until = m.locked_until_utc
        if receiver.session is not None and receiver.session.locked_until_utc is not None:
            locked_until = receiver.session.locked_until_utc
        received = to_received(queue, m, locked_until)
        held = _Held(receiver, m, received, received.message_id, threading.Lock())
        with self._lock:
            self._held[received.lock_token or ""] = held
        return held

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        raise ValidationError(
            "the Service Bus command queue does not receive-and-delete: commands must not be lost",
            hint="use receive() and settle",
        )

    # --- settling -------------------------------------------------------------------------------

    def _find(self, target: ReceivedMessage | str, *, take: bool) -> _Held:
        token = target if isinstance(target, str) else target.lock_token
        mid = target if isinstance(target, str) else target.message_id
        if token is None:
            raise ValidationError(f"message {mid} has no lock: it was received and deleted")
        with self._lock:
            held = self._held.pop(token, None) if take else self._held.get(token)
        if held is None:
            raise LockLostError(
                f"message {mid}: no lock held with that token (settled already, or received "
                "elsewhere)"
            )
        return held

    def _settle(self, held: _Held, how: str, action: Callable[[], Any]) -> None:
        try:
            with held.lock:
                action()
        except self._lock_errors() as e:
            raise LockLostError(
                f"message {held.original_id}: lock lost before {how} ({type(e).__name__})"
            ) from e
        except Exception as e:
            raise self.unavailable(f"message {held.original_id}: {how} failed", e) from e
        finally:
            with contextlib.suppress(Exception):
                held.receiver.close()  # releases the session

    def _lock_errors(self) -> tuple[type[BaseException], ...]:
        e = self._errors
        return (e.SessionLockLostError, e.MessageLockLostError, e.MessageAlreadySettled)

    def complete(self, target: ReceivedMessage | str) -> None:
        held = self._find(target, take=True)
        self._settle(held, "complete", lambda: held.receiver.complete_message(held.sdk_message))
        self._forget_deferred(held)

    def _forget_deferred(self, held: _Held) -> None:
        """A settled deferred message is gone: its session need not be remembered."""
        if held.deferred:
            with self._lock:
                self._deferred_sessions.pop(held.received.sequence_number, None)

    def dead_letter(
        self, target: ReceivedMessage | str, reason: str, description: str = ""
    ) -> None:
        held = self._find(target, take=True)
        self._settle(
            held,
            "dead_letter",
            lambda: held.receiver.dead_letter_message(
                held.sdk_message, reason=reason, error_description=description
            ),
        )
        self._forget_deferred(held)

    def abandon(self, target: ReceivedMessage | str, delay: float = 0) -> None:
        """Release for another delivery, after ``delay`` seconds (a scheduled copy, see above).
        At ``max_delivery_count`` deliveries the message is dead-lettered instead."""
        held = self._find(target, take=True)
        count = held.received.delivery_count
        if count >= self.max_delivery_count:
            with self._lock:
                self._held[held.received.lock_token or ""] = held
            self.dead_letter(target, MAX_DELIVERY_REASON, f"abandoned after {count} deliveries")
            return
        if delay <= 0 or held.deferred:  # a deferred message stays deferred: no copy, no delay
            self._settle(held, "abandon", lambda: held.receiver.abandon_message(held.sdk_message))
            return
        self._settle(held, "abandon", lambda: self._retry_later(held, delay))

    def _retry_later(self, held: _Held, delay: float) -> None:
        r, m = held.received, held.sdk_message
        held.receiver.session.renew_lock()  # raises SessionLockLostError if it is not ours
        copy = QueueMessage(
            body=r.body,
            message_id=derived_id(r.message_id, str(r.delivery_count)),
            session_id=r.session_id,
            not_before=utc(self.clock.now()) + timedelta(seconds=delay),
            subject=r.subject,
            content_type=r.content_type,
            correlation_id=r.correlation_id,
            headers=dict(r.headers),
        )
        extra = {PROP_ORIGINAL_ID: r.message_id, PROP_PRIOR_DELIVERIES: str(r.delivery_count)}
        sdk_copy = self._to_sdk(copy, extra=extra)
        if r.session_id is None:  # the copy stays in the original's own session
            sdk_copy.session_id = m.session_id
        self._send_sdk(r.queue, [sdk_copy])
        held.receiver.complete_message(m)

    def defer(self, target: ReceivedMessage | str) -> None:
        """Set the message aside (``defer_message``): only ``receive_deferred`` brings it back."""
        held = self._find(target, take=True)
        count = held.received.delivery_count
        if count >= self.max_delivery_count:  # a defer counts like an abandon (and a copy's
            with self._lock:  # deliveries are ours to count)
                self._held[held.received.lock_token or ""] = held
            self.dead_letter(target, MAX_DELIVERY_REASON, f"deferred after {count} deliveries")
            return
        self._settle(held, "defer", lambda: held.receiver.defer_message(held.sdk_message))
        with self._lock:
            self._deferred_sessions[held.received.sequence_number] = str(
                held.sdk_message.session_id
            )

    def receive_deferred(
        self,
        queue: str,
        sequence_numbers: int | Sequence[int],
        *,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Each deferred message through a receiver of its session (the session this instance
        deferred it from, or ``session_id``); one message per session, as each received message
        holds its session's lock until it is settled."""
        self._check_open()
        validation.queue_name(queue)
        validation.identifier("session_id", session_id, optional=True)
        wanted = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        seqs = sorted({validation.positive("sequence number", n) for n in wanted})
        sessions: dict[int, str] = {}
        with self._lock:
            for n in seqs:
                sid = session_id or self._deferred_sessions.get(n)
                if sid is None:
                    raise MessageNotFoundError(
                        f"queue {queue}: this queue deferred no message with sequence number "
                        f"{n}, and Service Bus receives a deferred message only through its "
                        "session",
                        hint="pass session_id=... (a message sent without one is in the session "
                        "named by its message id)",
                    )
                sessions[n] = sid
        if len(set(sessions.values())) != len(sessions):
            raise ValidationError(
                "receive_deferred on Service Bus takes one deferred message per session at a "
                "time (a received message holds its session until it is settled)",
                hint="settle it, then receive the next one of that session",
            )
        out: list[ReceivedMessage] = []
        try:
            for n in seqs:
                got = self._receive_deferred_one(queue, n, sessions[n])
                if got is not None:
                    out.append(got)
        except Exception:
            for m in out:  # all or nothing, as on the SQL queue: release what was taken
                with contextlib.suppress(Exception):
                    self._find(m, take=True).receiver.close()
            raise
        return out

    def _receive_deferred_one(self, queue: str, n: int, session: str) -> ReceivedMessage | None:
        with self._lock:
            receiver = self._client.get_queue_receiver(
                queue_name=queue, session_id=session, max_wait_time=self.max_wait_time
            )
        try:
            [m] = receiver.receive_deferred_messages([n])
        except (self._errors.MessageNotFoundError, self._errors.SessionCannotBeLockedError) as e:
            receiver.close()
            raise MessageNotFoundError(
                f"queue {queue}: no deferred message with sequence number {n} is free to receive "
                f"({type(e).__name__})",
                hint="it was settled, is not deferred, or another receiver holds its session",
            ) from e
        except Exception as e:
            with contextlib.suppress(Exception):
                receiver.close()
            raise self.unavailable(f"cannot receive deferred message {n} from {queue!r}", e) from e
        held = self._hold(queue, receiver, m)
        held.deferred = True
        if held.received.delivery_count <= self.max_delivery_count:
            return held.received
        with contextlib.suppress(LockLostError):
            self.dead_letter(
                held.received,
                MAX_DELIVERY_REASON,
                f"delivered {held.received.delivery_count - 1} times",
            )
        return None

    def renew_lock(self, target: ReceivedMessage | str) -> datetime:
        held = self._find(target, take=False)
        try:
            with held.lock:
                until = held.receiver.session.renew_lock()
        except self._lock_errors() as e:
            with self._lock:
                self._held.pop(held.received.lock_token or "", None)
            raise LockLostError(
                f"message {held.original_id}: lock lost, cannot renew ({type(e).__name__})"
            ) from e
        except Exception as e:
            raise self.unavailable(f"message {held.original_id}: renew failed", e) from e
        return utc(until)

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        raise ValidationError(
            "Service Bus cannot peek a session-enabled queue across sessions",
            hint="use `outbox status` for its depths",
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
        return self.dead_letters.count(self.command_queue, ids, where=where, all=all)

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        return self.dead_letters.move(
            self.command_queue, ids, where=where, all=all, on_progress=on_progress, requeue=True
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
            self.command_queue, ids, where=where, all=all, on_progress=on_progress, requeue=False
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
        with self._lock:
            if self._closed:
                return
            self._closed = True
            senders = [s for s, _ in self._senders.values()]
            held = list(self._held.values())
            self._senders.clear()
            self._held.clear()
        for thing in [*senders, *(h.receiver for h in held)]:
            with contextlib.suppress(Exception):
                thing.close()
        if self._owns_client:
            for c in (self._client, self._admin):
                with contextlib.suppress(Exception):
                    if c is not None:
                        c.close()


def connect(env: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    """(ServiceBusClient, ServiceBusAdministrationClient) from the environment, or from the
    factory ``sdk.use_clients`` installed."""
    factory = sdk.client_factory()
    if factory is not None:
        return factory()
    sb, _ = sdk.load()
    from azure.servicebus.management import ServiceBusAdministrationClient

    env = os.environ if env is None else env
    conn = env.get(sdk.ENV_CONNECTION_STRING, "").strip()
    if conn:
        try:
            return (
                sb.ServiceBusClient.from_connection_string(conn),
                ServiceBusAdministrationClient.from_connection_string(conn),
            )
        except (ValueError, TypeError) as e:  # never echo the string: it holds a key
            raise ConfigurationError(
                f"{sdk.ENV_CONNECTION_STRING} is not a valid Service Bus connection string "
                f"({type(e).__name__})"
            ) from e
    namespace = env.get(sdk.ENV_NAMESPACE, "").strip()
    if namespace:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as e:
            raise MissingDependencyError(
                f"{sdk.ENV_NAMESPACE} is set, which needs azure-identity for the credential",
                hint=f"pip install azure-identity, or set {sdk.ENV_CONNECTION_STRING} instead",
            ) from e
        credential = DefaultAzureCredential()
        return (
            sb.ServiceBusClient(namespace, credential),
            ServiceBusAdministrationClient(namespace, credential),
        )
    raise ConfigurationError(
        f"Service Bus (command_transport or transport 'servicebus') needs "
        f"{sdk.ENV_CONNECTION_STRING} (or {sdk.ENV_NAMESPACE} with azure-identity installed)",
        hint="or set command_transport = 'sql' and a transport other than servicebus",
    )

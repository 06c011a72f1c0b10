"""A faithful in-memory fake of the Azure Service Bus SDK surface the outbox uses, send and receive.

Why a fake: no local server speaks to the Python SDK (it insists on the ``$cbs`` claims-based
security node; docs/servicebus.md), and Microsoft's emulator needs Docker. So the kit ships this
broker model and the adapters are tested against it, plus live tests when a namespace is
configured. Each behaviour below is the documented one (docs/servicebus.md says where each was
checked):

* sessions: a session-enabled queue refuses a message without a session id; a session receiver
  locks a whole session (``NEXT_AVAILABLE_SESSION`` takes an unlocked session with an active
  message, else ``OperationTimeoutError``; a named session held elsewhere is
  ``SessionCannotBeLockedError``); the session lock lasts ``lock_duration`` and is renewed with
  ``receiver.session.renew_lock()``; a message's lock *is* its session's lock
  (``renew_message_lock`` is a ``TypeError``); after the lock expires, settling raises
  ``SessionLockLostError`` and the session's messages are delivered again;
* delivery counts: the broker counts deliveries from 1; the AMQP header (what the Python SDK's
  ``delivery_count`` returns) carries that count minus one. Abandon and lock expiry count a
  delivery; closing a session receiver without settling does not. When a counted delivery reaches
  ``max_delivery_count`` the message moves to the dead-letter subqueue with reason
  ``MaxDeliveryCountExceeded``;
* settling twice is ``MessageAlreadySettled``; settling on a closed receiver is ``ValueError``;
* scheduled messages (``scheduled_enqueue_time_utc`` or ``schedule_messages``) are invisible until
  their time; ``cancel_scheduled_messages`` removes them;
* defer: ``defer_message`` releases the lock and sets the message aside (its delivery count kept);
  ``receive_messages`` and ``NEXT_AVAILABLE_SESSION`` skip it; only
  ``receive_deferred_messages(sequence_numbers)`` returns it, locked and counted, and a session
  receiver only its own session's; a number that is not a deferred message is
  ``MessageNotFoundError``; abandoning it, or its lock expiring, leaves it deferred; deferring a
  message delivered ``max_delivery_count`` times dead-letters it (Azure/azure-service-bus#375); the
  runtime properties count deferred messages as active (they "remain in the main queue along with
  all other active messages", Microsoft Learn "Message deferral");
* duplicate detection drops a repeated ``message_id`` inside the window and reports success;
* the dead-letter subqueue of a session-enabled queue is received without sessions;
* ``application_properties`` come back with bytes keys and bytes string values;
* administration: queues and topics share one namespace of names; creating an existing name is
  ``ResourceExistsError`` (HTTP 409), reading a missing one ``ResourceNotFoundError``; a property
  left out of ``create_queue``/``create_topic`` takes the service's default (no sessions, no
  duplicate detection, a 1 minute lock, 10 deliveries, a 10 minute window);
* senders: ``create_message_batch`` returns the SDK's real ``ServiceBusMessageBatch``; a topic
  stores what it accepted in ``FakeServiceBus.topics[name].accepted`` (the fake models no
  subscriptions, so nothing is received from a topic).

Time comes from an injected clock (``ManualClock``); nothing waits: where the service would wait
``max_wait_time`` for a session or a message, the fake answers at once.

Why one module: the namespace, its receivers, senders and administration client share one broker
state under one lock (a settlement checks the session table a receive wrote); a third party
imports one file to get all of it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus import exceptions as sb_errors

from outbox.core.clock import Clock, ManualClock, utc

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
#: A batch's size limit when ``create_message_batch`` is given none (the Standard tier's 256 KB).
LINK_MAX_BYTES = 256 * 1024


@dataclass
class QueueSpec:
    """A queue's properties, named as ``QueueProperties`` names them."""

    name: str
    requires_session: bool = True
    requires_duplicate_detection: bool = True
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    max_delivery_count: int = 10
    lock_duration: timedelta = timedelta(seconds=30)


#: What the service gives a property ``create_queue`` leaves out (``QueueSpec``'s own defaults
#: are the command queue's shape, for tests that build a namespace directly).
SERVICE_QUEUE_DEFAULTS: dict[str, Any] = {
    "requires_session": False,
    "requires_duplicate_detection": False,
    "duplicate_detection_history_time_window": timedelta(minutes=10),
    "max_delivery_count": 10,
    "lock_duration": timedelta(minutes=1),
}


@dataclass
class TopicSpec:
    """A topic's properties, named as ``TopicProperties`` names them (service defaults)."""

    name: str
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)


@dataclass
class RuntimeProperties:
    """What ``get_queue_runtime_properties`` reports (locked messages count as active)."""

    name: str
    active_message_count: int
    scheduled_message_count: int
    dead_letter_message_count: int
    #: the fake has no auto-forwarding, so nothing is ever in transfer
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0

    @property
    def total_message_count(self) -> int:
        return self.active_message_count + self.scheduled_message_count


@dataclass
class Stored:
    """One message as the broker holds it."""

    seq: int
    message_id: str
    session_id: str | None
    body: bytes
    properties: dict[str, Any]
    subject: str | None
    content_type: str | None
    correlation_id: str | None
    enqueued_at: datetime
    visible_at: datetime
    deliveries: int = 0  # the broker's count, from 1; the AMQP header carries it minus one
    lock_token: str | None = None
    locked_until: datetime | None = None
    holder: str | None = None  # the receiver that holds the lock
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    deferred: bool = False  # set aside by defer_message: received only by sequence number


@dataclass
class _Queue:
    spec: QueueSpec
    active: list[Stored] = field(default_factory=list)
    dead: list[Stored] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)
    sessions: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # id -> holder, until


@dataclass
class _Topic:
    spec: TopicSpec
    accepted: list[Stored] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)


class FakeReceivedMessage:
    """The attributes of ``ServiceBusReceivedMessage`` the adapters read."""

    def __init__(self, s: Stored, queue: str) -> None:
        self.queue = queue
        self.message_id = s.message_id
        self.session_id = s.session_id
        self._body = s.body
        self.application_properties = {
            k.encode(): v.encode() if isinstance(v, str) else v for k, v in s.properties.items()
        }
        self.subject = s.subject
        self.content_type = s.content_type
        self.correlation_id = s.correlation_id
        self.sequence_number = s.seq
        self.enqueued_time_utc = s.enqueued_at
        self.scheduled_enqueue_time_utc = s.visible_at if s.visible_at > s.enqueued_at else None
        self.delivery_count = max(s.deliveries - 1, 0)
        self.lock_token = s.lock_token
        self.locked_until_utc = s.locked_until
        self.dead_letter_reason = s.dead_letter_reason
        self.dead_letter_error_description = s.dead_letter_description
        self.settled = False

    @property
    def body(self) -> Iterator[bytes]:
        """Like the SDK's data body: an iterable of byte sections."""
        return iter([self._body])

    def __str__(self) -> str:
        return self._body.decode("utf-8", "replace")


def _body_bytes(body: Any) -> bytes:
    """A sent body as bytes: data sections joined; ``ServiceBusMessage(None)`` has none (b"")."""
    if body is None:
        return b""
    return body if isinstance(body, bytes) else b"".join(body)


class FakeServiceBus:
    """The namespace: queues, a clock, and the broker's rules. Thread-safe (one lock)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or ManualClock()
        self.lock = threading.RLock()
        self.queues: dict[str, _Queue] = {}
        self.topics: dict[str, _Topic] = {}
        self._seq = 0

    # --- administration and inspection --------------------------------------------------------

    def _check_free(self, name: str) -> None:
        """Queues and topics share the namespace's entity names (409 Conflict on a taken one)."""
        if name in self.queues or name in self.topics:
            raise ResourceExistsError(f"The messaging entity '{name}' already exists.")

    def create_queue(self, name: str, **props: Any) -> QueueSpec:
        with self.lock:
            self._check_free(name)
            spec = QueueSpec(name, **props)
            self.queues[name] = _Queue(spec)
            return spec

    def create_topic(self, name: str, **props: Any) -> TopicSpec:
        with self.lock:
            self._check_free(name)
            spec = TopicSpec(name, **props)
            self.topics[name] = _Topic(spec)
            return spec

    def now(self) -> datetime:
        return utc(self.clock.now())

    def queue(self, name: str) -> _Queue:
        q = self.queues.get(name)
        if q is None:
            raise sb_errors.MessagingEntityNotFoundError(
                message=f"The messaging entity 'sb://fake.servicebus.windows.net/{name}' could "
                "not be found."
            )
        self._expire(q)
        return q

    def messages(self, name: str) -> list[Stored]:
        """Every message of the queue (test inspection; the service has no cross-session peek)."""
        with self.lock:
            return list(self.queue(name).active)

    def dead_letters(self, name: str) -> list[Stored]:
        with self.lock:
            return list(self.queue(name).dead)

    def runtime_properties(self, name: str) -> RuntimeProperties:
        with self.lock:
            if name not in self.queues:
                raise ResourceNotFoundError(f"Entity '{name}' was not found.")
            q = self.queue(name)
            now = self.now()
            scheduled = sum(1 for s in q.active if s.visible_at > now)
            return RuntimeProperties(name, len(q.active) - scheduled, scheduled, len(q.dead))

    def client(self) -> FakeServiceBusClient:
        return FakeServiceBusClient(self)

    def admin(self) -> FakeAdministrationClient:
        return FakeAdministrationClient(self)

    # --- the broker's rules ---------------------------------------------------------------------

    def accept(
        self, name: str, messages: Sequence[ServiceBusMessage], when: datetime | None
    ) -> list[int]:
        """Store a batch whole (or nothing), dropping duplicates; returns sequence numbers."""
        with self.lock:
            if name in self.topics:
                return self._accept_topic(self.topics[name], messages)
            q = self.queue(name)
            for m in messages:
                if q.spec.requires_session and not m.session_id:
                    raise sb_errors.ServiceBusError(
                        message="The SessionId was not set on a message, and it cannot be sent to "
                        "the entity. Entities that have session support enabled can only receive "
                        "messages that have the SessionId set to a valid value."
                    )
            now = self.now()
            out = []
            for m in messages:
                mid = m.message_id or str(uuid.uuid4())
                window = q.spec.duplicate_detection_history_time_window
                if (
                    q.spec.requires_duplicate_detection
                    and mid in q.seen
                    and now - q.seen[mid] < window
                ):
                    out.append(0)
                    continue  # dropped, and reported as a success
                q.seen[mid] = now
                self._seq += 1
                at = when or m.scheduled_enqueue_time_utc
                body = _body_bytes(m.body)
                q.active.append(
                    Stored(
                        self._seq,
                        mid,
                        m.session_id,
                        body,
                        {
                            (k.decode() if isinstance(k, bytes) else k): v
                            for k, v in (m.application_properties or {}).items()
                        },
                        m.subject,
                        m.content_type,
                        m.correlation_id,
                        now,
                        max(utc(at), now) if at is not None else now,
                    )
                )
                out.append(self._seq)
            return out

    def _accept_topic(self, t: _Topic, messages: Sequence[ServiceBusMessage]) -> list[int]:
        now = self.now()
        out = []
        for m in messages:
            mid = m.message_id or str(uuid.uuid4())
            window = t.spec.duplicate_detection_history_time_window
            if t.spec.requires_duplicate_detection and mid in t.seen and now - t.seen[mid] < window:
                out.append(0)
                continue
            t.seen[mid] = now
            self._seq += 1
            body = _body_bytes(m.body)
            t.accepted.append(
                Stored(
                    self._seq,
                    mid,
                    m.session_id,
                    body,
                    {},
                    m.subject,
                    m.content_type,
                    m.correlation_id,
                    now,
                    now,
                )
            )
            out.append(self._seq)
        return out

    def _expire(self, q: _Queue) -> None:
        """Locks past their time end: each such delivery counts, up to the dead-letter move."""
        now = self.now()
        for sid, (_, until) in list(q.sessions.items()):
            if until <= now:
                del q.sessions[sid]
        for s in list(q.active):
            if s.locked_until is not None and s.locked_until <= now:
                self._release(q, s, counted=True)

    def _release(self, q: _Queue, s: Stored, *, counted: bool) -> None:
        s.lock_token = s.locked_until = s.holder = None
        if not counted:
            s.deliveries -= 1
        elif s.deliveries >= q.spec.max_delivery_count:
            self._dead_letter(
                q,
                s,
                MAX_DELIVERY_REASON,
                f"Message could not be consumed after {s.deliveries} delivery attempts.",
            )

    def _dead_letter(
        self, q: _Queue, s: Stored, reason: str | None, description: str | None
    ) -> None:
        q.active.remove(s)
        s.lock_token = s.locked_until = s.holder = None
        s.dead_letter_reason, s.dead_letter_description = reason, description
        q.dead.append(s)

    def deliverable(self, q: _Queue, s: Stored) -> bool:
        return s.lock_token is None and not s.deferred and s.visible_at <= self.now()

    def lock_session(self, q: _Queue, holder: str, wanted: object) -> str:
        """Lock ``wanted`` (a session id or NEXT_AVAILABLE_SESSION) for ``holder``."""
        now = self.now()
        if wanted == NEXT_AVAILABLE_SESSION:
            for s in q.active:  # sessions in the order of their oldest deliverable message
                if s.session_id not in q.sessions and self.deliverable(q, s):
                    assert s.session_id is not None
                    wanted = s.session_id
                    break
            else:
                raise sb_errors.OperationTimeoutError(
                    message="Failed to initiate the connection: no session is available."
                )
        sid = str(wanted)
        if sid in q.sessions and q.sessions[sid][0] != holder:
            raise sb_errors.SessionCannotBeLockedError(
                message=f"The requested session '{sid}' cannot be accepted. It may be locked by "
                "another receiver."
            )
        q.sessions[sid] = (holder, now + q.spec.lock_duration)
        return sid


class FakeSession:
    """``receiver.session``: the session lock of one session receiver."""

    def __init__(self, receiver: FakeReceiver, session_id: str) -> None:
        self._receiver = receiver
        self.session_id = session_id

    @property
    def locked_until_utc(self) -> datetime | None:
        with self._receiver.bus.lock:
            held = self._receiver.bus.queue(self._receiver.queue_name).sessions.get(self.session_id)
            return held[1] if held and held[0] == self._receiver.id else None

    def renew_lock(self, *, timeout: float | None = None) -> datetime:
        bus = self._receiver.bus
        with bus.lock:
            self._receiver.check_live()
            q = self._receiver.held_session_queue()
            until = bus.now() + q.spec.lock_duration
            q.sessions[self.session_id] = (self._receiver.id, until)
            for s in q.active:
                if s.holder == self._receiver.id:
                    s.locked_until = until
            return until


class FakeReceiver:
    """``ServiceBusReceiver`` on a queue, its dead-letter subqueue, or one session of it."""

    def __init__(
        self,
        bus: FakeServiceBus,
        queue_name: str,
        *,
        session_id: object = None,
        sub_queue: object = None,
        receive_mode: object = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        **_: Any,
    ) -> None:
        self.bus = bus
        self.queue_name = queue_name
        self.id = str(uuid.uuid4())
        self._wanted = session_id
        self.dead_letter = sub_queue in (ServiceBusSubQueue.DEAD_LETTER, "deadletter")
        self.receive_mode = receive_mode
        self.session: FakeSession | None = None
        self.closed = False
        self._opened = False

    def check_live(self) -> None:
        if self.closed:
            raise ValueError(
                "The handler has already been shutdown. Please use ServiceBusClient to create a "
                "new instance."
            )

    def _open(self) -> _Queue:
        self.check_live()
        q = self.bus.queue(self.queue_name)
        if self._opened:
            return q
        sessionful = self._wanted is not None
        if not self.dead_letter and sessionful != q.spec.requires_session:
            raise sb_errors.ServiceBusError(
                message="It is not possible for an entity that requires sessions to create a "
                "non-sessionful message receiver."
                if q.spec.requires_session
                else "A sessionful message receiver cannot be created on an entity that does not "
                "require sessions."
            )
        if sessionful and not self.dead_letter:
            self.session = FakeSession(self, self.bus.lock_session(q, self.id, self._wanted))
        self._opened = True
        return q

    def held_session_queue(self) -> _Queue:
        """The queue, if this receiver still holds its session lock (else SessionLockLostError)."""
        q = self.bus.queue(self.queue_name)
        assert self.session is not None
        held = q.sessions.get(self.session.session_id)
        if held is None or held[0] != self.id:
            raise sb_errors.SessionLockLostError(
                message="The session lock has expired on the MessageSession. Accept a new "
                "MessageSession."
            )
        return q

    def __enter__(self) -> FakeReceiver:
        with self.bus.lock:
            self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[FakeReceivedMessage]:
        with self.bus.lock:
            q = self._open()
            pool = q.dead if self.dead_letter else q.active
            if self.session is not None:
                q = self.held_session_queue()
            until = self.bus.now() + q.spec.lock_duration
            if self.session is not None:
                until = q.sessions[self.session.session_id][1]
            out: list[FakeReceivedMessage] = []
            for s in list(pool):
                if len(out) >= (max_message_count or 1):
                    break
                if self.session is not None and s.session_id != self.session.session_id:
                    continue
                if s.lock_token is not None or s.visible_at > self.bus.now() or s.deferred:
                    continue
                if self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
                    pool.remove(s)
                    s.deliveries += 1
                    out.append(FakeReceivedMessage(s, self.queue_name))
                    continue
                s.deliveries += 1
                s.lock_token, s.locked_until, s.holder = str(uuid.uuid4()), until, self.id
                out.append(FakeReceivedMessage(s, self.queue_name))
            return out

    def receive_deferred_messages(
        self, sequence_numbers: int | Sequence[int], *, timeout: float | None = None
    ) -> list[FakeReceivedMessage]:
        """The deferred messages with these numbers, locked (a session receiver: of its session)."""
        wanted = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        if not wanted:
            return []
        with self.bus.lock:
            q = self._open()
            if self.session is not None:
                q = self.held_session_queue()
            found = {
                s.seq: s
                for s in q.active
                if s.seq in wanted
                and s.deferred
                and s.lock_token is None
                and (self.session is None or s.session_id == self.session.session_id)
            }
            if len(found) != len(set(wanted)):
                raise sb_errors.MessageNotFoundError(
                    message="Failed to retrieve the deferred message(s) with sequence number(s) "
                    f"{sorted(set(wanted) - set(found))}."
                )
            until = self.bus.now() + q.spec.lock_duration
            if self.session is not None:
                until = q.sessions[self.session.session_id][1]
            out = []
            for seq in sorted(found):
                s = found[seq]
                s.deliveries += 1
                s.lock_token, s.locked_until, s.holder = str(uuid.uuid4()), until, self.id
                out.append(FakeReceivedMessage(s, self.queue_name))
            return out

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, **_: Any
    ) -> list[FakeReceivedMessage]:
        with self.bus.lock:
            q = self._open()
            pool = q.dead if self.dead_letter else q.active
            found = [s for s in pool if s.seq >= sequence_number]
            if self.session is not None:
                found = [s for s in found if s.session_id == self.session.session_id]
            return [FakeReceivedMessage(s, self.queue_name) for s in found[:max_message_count]]

    # --- settlement ---------------------------------------------------------------------------

    def _held(self, message: FakeReceivedMessage) -> tuple[_Queue, Stored]:
        self.check_live()
        if message.settled:
            raise sb_errors.MessageAlreadySettled(action="settle")
        if message.lock_token is None:
            raise ValueError("The message was received in RECEIVE_AND_DELETE mode: no lock.")
        q = (
            self.held_session_queue()
            if self.session is not None
            else self.bus.queue(self.queue_name)
        )
        pool = q.dead if self.dead_letter else q.active
        for s in pool:
            if s.lock_token == message.lock_token and s.holder == self.id:
                return q, s
        if self.session is not None:
            raise sb_errors.SessionLockLostError(message="The session lock has expired.")
        raise sb_errors.MessageLockLostError(
            message="The lock supplied is invalid. Either the lock expired, or the message has "
            "already been removed from the queue."
        )

    def complete_message(self, message: FakeReceivedMessage) -> None:
        with self.bus.lock:
            q, s = self._held(message)
            (q.dead if self.dead_letter else q.active).remove(s)
            message.settled = True

    def abandon_message(self, message: FakeReceivedMessage) -> None:
        with self.bus.lock:
            q, s = self._held(message)
            message.settled = True
            if self.dead_letter:
                s.lock_token = s.locked_until = s.holder = None
            else:
                self.bus._release(q, s, counted=True)

    def defer_message(self, message: FakeReceivedMessage) -> None:
        with self.bus.lock:
            q, s = self._held(message)
            if self.dead_letter:
                raise sb_errors.ServiceBusError(message="Cannot defer a dead letter.")
            message.settled = True
            s.deferred = True
            self.bus._release(q, s, counted=True)  # at max_delivery_count: dead-lettered

    def dead_letter_message(
        self,
        message: FakeReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        with self.bus.lock:
            q, s = self._held(message)
            if self.dead_letter:
                raise sb_errors.ServiceBusError(message="Cannot dead-letter a dead letter.")
            message.settled = True
            self.bus._dead_letter(q, s, reason, error_description)

    def renew_message_lock(
        self, message: FakeReceivedMessage, *, timeout: float | None = None
    ) -> datetime:
        if self.session is not None:
            raise TypeError(
                "Renewing message lock is an invalid operation when working with sessions."
                "Please renew the session lock instead."
            )
        with self.bus.lock:
            q, s = self._held(message)
            s.locked_until = self.bus.now() + q.spec.lock_duration
            message.locked_until_utc = s.locked_until
            return s.locked_until

    def close(self) -> None:
        """Release the session: its unsettled messages are delivered again, not counted."""
        with self.bus.lock:
            if self.closed:
                return
            self.closed = True
            q = self.bus.queues.get(self.queue_name)
            if q is None:
                return
            for s in list(q.active if not self.dead_letter else q.dead):
                if s.holder == self.id:
                    if self.dead_letter:
                        s.lock_token = s.locked_until = s.holder = None
                    else:
                        self.bus._release(q, s, counted=False)
            if self.session is not None:
                held = q.sessions.get(self.session.session_id)
                if held is not None and held[0] == self.id:
                    del q.sessions[self.session.session_id]


class FakeSender:
    """``ServiceBusSender`` for one queue or topic."""

    def __init__(self, bus: FakeServiceBus, queue_name: str) -> None:
        self.bus = bus
        self.queue_name = queue_name  # the entity: a queue's or a topic's name
        self.closed = False
        self.fail_next: list[BaseException] = []  # test hook: raised by the next sends

    def _check(self) -> None:
        if self.closed:
            raise ValueError("The handler has already been shutdown.")
        if self.fail_next:
            raise self.fail_next.pop(0)

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        """The SDK's real batch (its size accounting); opening the link finds a missing entity."""
        self._check()
        with self.bus.lock:
            if self.queue_name not in self.bus.topics:
                self.bus.queue(self.queue_name)  # MessagingEntityNotFoundError when missing
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or LINK_MAX_BYTES)

    def send_messages(
        self,
        message: ServiceBusMessage | ServiceBusMessageBatch | Sequence[ServiceBusMessage],
        *,
        timeout: float | None = None,
    ) -> None:
        self._check()
        if isinstance(message, ServiceBusMessageBatch):
            batch = list(message._messages)  # where the real batch keeps its messages
        elif isinstance(message, ServiceBusMessage):
            batch = [message]
        else:
            batch = list(message)
        self.bus.accept(self.queue_name, batch, None)

    def schedule_messages(
        self, messages: ServiceBusMessage | Sequence[ServiceBusMessage], schedule_time_utc: datetime
    ) -> list[int]:
        self._check()
        batch = [messages] if isinstance(messages, ServiceBusMessage) else list(messages)
        return self.bus.accept(self.queue_name, batch, schedule_time_utc)

    def cancel_scheduled_messages(self, sequence_numbers: int | Sequence[int]) -> None:
        self._check()
        seqs = {sequence_numbers} if isinstance(sequence_numbers, int) else set(sequence_numbers)
        with self.bus.lock:
            q = self.bus.queue(self.queue_name)
            q.active = [s for s in q.active if s.seq not in seqs]

    def close(self) -> None:
        self.closed = True


class FakeServiceBusClient:
    """``ServiceBusClient``: builds senders and receivers on the fake namespace."""

    def __init__(self, bus: FakeServiceBus) -> None:
        self.bus = bus
        self.closed = False
        self.receivers: list[FakeReceiver] = []

    def get_queue_sender(self, queue_name: str, **_: Any) -> FakeSender:
        return FakeSender(self.bus, queue_name)

    def get_topic_sender(self, topic_name: str, **_: Any) -> FakeSender:
        return FakeSender(self.bus, topic_name)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> FakeReceiver:
        receiver = FakeReceiver(self.bus, queue_name, **kwargs)
        self.receivers.append(receiver)
        return receiver

    def close(self) -> None:
        self.closed = True


class FakeAdministrationClient:
    """``ServiceBusAdministrationClient``: queues and their runtime properties."""

    def __init__(self, bus: FakeServiceBus) -> None:
        self.bus = bus
        self.created: list[str] = []
        self.updated: list[str] = []  # must stay empty: the outbox never changes an entity

    def get_queue(self, queue_name: str, **_: Any) -> QueueSpec:
        with self.bus.lock:
            q = self.bus.queues.get(queue_name)
            if q is None:
                raise ResourceNotFoundError(f"Entity '{queue_name}' was not found.")
            return q.spec

    def create_queue(self, queue_name: str, **props: Any) -> QueueSpec:
        given = {k: v for k, v in props.items() if k in SERVICE_QUEUE_DEFAULTS and v is not None}
        spec = self.bus.create_queue(queue_name, **{**SERVICE_QUEUE_DEFAULTS, **given})
        self.created.append(queue_name)
        return spec

    def get_topic(self, topic_name: str, **_: Any) -> TopicSpec:
        with self.bus.lock:
            t = self.bus.topics.get(topic_name)
            if t is None:
                raise ResourceNotFoundError(f"Topic '{topic_name}' does not exist")
            return t.spec

    def create_topic(self, topic_name: str, **props: Any) -> TopicSpec:
        known = set(TopicSpec.__dataclass_fields__) - {"name"}
        spec = self.bus.create_topic(
            topic_name, **{k: v for k, v in props.items() if k in known and v is not None}
        )
        self.created.append(topic_name)
        return spec

    def update_topic(self, topic: Any, **_: Any) -> None:
        self.updated.append(getattr(topic, "name", str(topic)))

    def update_queue(self, queue: Any, **_: Any) -> None:
        self.updated.append(getattr(queue, "name", str(queue)))

    def get_queue_runtime_properties(self, queue_name: str, **_: Any) -> RuntimeProperties:
        return self.bus.runtime_properties(queue_name)

    def close(self) -> None:
        pass


def clients(
    bus: FakeServiceBus,
) -> Callable[[], tuple[FakeServiceBusClient, FakeAdministrationClient]]:
    """A factory for ``sdk.use_clients``: every adapter built from settings talks to
    ``bus``."""
    return lambda: (bus.client(), bus.admin())

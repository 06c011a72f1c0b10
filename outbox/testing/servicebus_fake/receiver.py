"""The fake ``ServiceBusReceiver``: on a queue, its dead-letter subqueue, or one session of it;
the session lock (``receiver.session``), the received messages, and settlement.

Why together: a received message is settled through the receiver that holds it, and a session
receiver's lock is its session's; the rules they follow are ``broker``'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus import exceptions as sb_errors

from outbox.testing.servicebus_fake.broker import Broker
from outbox.testing.servicebus_fake.entities import QueueEntity, Stored


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
        bus: Broker,
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

    def _open(self) -> QueueEntity:
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

    def held_session_queue(self) -> QueueEntity:
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

    def _held(self, message: FakeReceivedMessage) -> tuple[QueueEntity, Stored]:
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

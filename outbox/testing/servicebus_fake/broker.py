"""The fake broker's state and rules: entities by name, acceptance with duplicate detection,
lock expiry, the delivery-count limit and the dead-letter move, session locks.

Why apart from the clients: receivers, senders and the administration client all act on this one
state; they import it, and ``namespace.FakeServiceBus`` adds the methods that build them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from azure.servicebus import exceptions as sb_errors

from outbox.core.clock import Clock, ManualClock, utc
from outbox.testing.servicebus_fake.entities import (
    MAX_DELIVERY_REASON,
    QueueEntity,
    QueueSpec,
    RuntimeProperties,
    Stored,
    TopicEntity,
    TopicSpec,
    body_bytes,
)


class Broker:
    """The namespace's state: queues, topics, a clock, and the broker's rules. Thread-safe (one
    lock). ``namespace.FakeServiceBus`` adds the clients."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or ManualClock()
        self.lock = threading.RLock()
        self.queues: dict[str, QueueEntity] = {}
        self.topics: dict[str, TopicEntity] = {}
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
            self.queues[name] = QueueEntity(spec)
            return spec

    def create_topic(self, name: str, **props: Any) -> TopicSpec:
        with self.lock:
            self._check_free(name)
            spec = TopicSpec(name, **props)
            self.topics[name] = TopicEntity(spec)
            return spec

    def now(self) -> datetime:
        return utc(self.clock.now())

    def queue(self, name: str) -> QueueEntity:
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
                body = body_bytes(m.body)
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

    def _accept_topic(self, t: TopicEntity, messages: Sequence[ServiceBusMessage]) -> list[int]:
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
            body = body_bytes(m.body)
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

    def _expire(self, q: QueueEntity) -> None:
        """Locks past their time end: each such delivery counts, up to the dead-letter move."""
        now = self.now()
        for sid, (_, until) in list(q.sessions.items()):
            if until <= now:
                del q.sessions[sid]
        for s in list(q.active):
            if s.locked_until is not None and s.locked_until <= now:
                self._release(q, s, counted=True)

    def _release(self, q: QueueEntity, s: Stored, *, counted: bool) -> None:
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
        self, q: QueueEntity, s: Stored, reason: str | None, description: str | None
    ) -> None:
        q.active.remove(s)
        s.lock_token = s.locked_until = s.holder = None
        s.dead_letter_reason, s.dead_letter_description = reason, description
        q.dead.append(s)

    def deliverable(self, q: QueueEntity, s: Stored) -> bool:
        return s.lock_token is None and not s.deferred and s.visible_at <= self.now()

    def lock_session(self, q: QueueEntity, holder: str, wanted: object) -> str:
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

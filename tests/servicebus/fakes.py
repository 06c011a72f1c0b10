"""Shared builders: a fake namespace with the command queue, and the adapter on it."""

from __future__ import annotations

from datetime import timedelta

from dispatcher.queue.messages import PeekedMessage
from dispatcher.servicebus.command_queue import ServiceBusCommandQueue
from dispatcher.servicebus.commands import PROP_NO_SESSION, PROP_ORIGINAL_ID
from outbox.core.clock import ManualClock
from outbox.testing.servicebus_fake import FakeServiceBus


class InspectableQueue(ServiceBusCommandQueue):
    """The adapter, with ``peek`` answered by the fake broker's inspection: the service has no
    cross-session peek, and the contract checks states through it."""

    def __init__(self, bus: FakeServiceBus, **kw: object) -> None:
        super().__init__(bus.client(), bus.admin(), **kw)  # type: ignore[arg-type]
        self.bus = bus

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        if queue not in self.bus.queues:
            return []
        now = self.bus.now()
        out = []
        stored = [s for s in self.bus.messages(queue) if s.deferred or not deferred]
        for s in stored[:limit]:
            state = (
                "locked"
                if s.lock_token
                else "deferred"
                if s.deferred
                else "scheduled"
                if s.visible_at > now
                else "active"
            )
            out.append(
                PeekedMessage(
                    queue=queue,
                    message_id=str(s.properties.get(PROP_ORIGINAL_ID) or s.message_id),
                    sequence_number=s.seq,
                    session_id=None if s.properties.get(PROP_NO_SESSION) else s.session_id,
                    state=state,
                    delivery_count=s.deliveries,
                    enqueued_at=s.enqueued_at,
                    not_before=s.visible_at,
                    locked_until=s.locked_until,
                    subject=s.subject or "",
                    content_type=s.content_type or "",
                    body=s.body,
                )
            )
        return out


def namespace(
    clock: ManualClock,
    *names: str,
    lock_duration: float = 30.0,
    max_delivery_count: int = 10,
    window: float = 600.0,
) -> FakeServiceBus:
    bus = FakeServiceBus(clock)
    for name in names:
        bus.create_queue(
            name,
            lock_duration=timedelta(seconds=lock_duration),
            max_delivery_count=max_delivery_count,
            duplicate_detection_history_time_window=timedelta(seconds=window),
        )
    return bus

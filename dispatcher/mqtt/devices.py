"""What ``outbox devices list|show`` reads: per device (a session of the gateway's queue), the task
in flight, how many wait behind it, and the dead-lettered (failed) ones.

Read from the queue alone, so it sees every gateway process at once and needs no table of its
own: a device's task is *in flight* while its session head is locked by a gateway. The queue
knows how often a task was handed to a gateway (``deliveries``: 1 unless a gateway died or
stopped while holding it) and when its lock ends; a gateway's own publish count and last publish
time live in that process only (its log says them), not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.queue.messages import DeadLetter, PeekedMessage
from dispatcher.queue.ports import QueueAdministration, QueueReceiver


@dataclass
class DeviceStatus:
    device: str
    #: the head task's id while a gateway holds it (None: nothing in flight)
    in_flight: str | None = None
    #: how many times the head task was handed to a gateway
    deliveries: int = 0
    #: when the head task was enqueued (how long the device has had work waiting)
    waiting_since: datetime | None = None
    #: when the holding gateway's lock ends unless renewed
    locked_until: datetime | None = None
    #: tasks waiting behind the head (or all of them, when none is in flight)
    queued: int = 0
    #: the next task to go out (the head when none is in flight)
    next_task: str | None = None
    failed: list[DeadLetter] = field(default_factory=list)

    def to_dict(self, *, details: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "device": self.device,
            "in_flight": self.in_flight,
            "deliveries": self.deliveries,
            "waiting_since": self.waiting_since,
            "locked_until": self.locked_until,
            "queued": self.queued,
            "next_task": self.next_task,
            "failed": len(self.failed),
        }
        if details:
            out["failed_tasks"] = [
                {
                    "message_id": d.message_id,
                    "reason": d.reason,
                    "description": d.description,
                    "dead_lettered_at": d.dead_lettered_at,
                }
                for d in self.failed
            ]
        return out


def device_statuses(
    receiver: QueueReceiver,
    admin: QueueAdministration,
    destination: str,
    *,
    limit: int = 10_000,
    device: str | None = None,
) -> list[DeviceStatus]:
    """Every device with tasks queued or failed on ``destination`` (the first ``limit`` of each),
    sorted by device; only ``device`` when given."""
    where = {"session_id": device} if device is not None else None
    messages = [m for m in receiver.peek(destination, limit) if m.session_id is not None]
    dead = admin.list_dead_letters(destination, limit, where=where)
    by_device: dict[str, DeviceStatus] = {}

    def status(name: str) -> DeviceStatus:
        return by_device.setdefault(name, DeviceStatus(name))

    for m in messages:
        assert m.session_id is not None
        if device is None or m.session_id == device:
            _add(status(m.session_id), m)
    for d in dead:
        if d.session_id is not None:
            status(d.session_id).failed.append(d)
    return [by_device[k] for k in sorted(by_device)]


def _add(s: DeviceStatus, m: PeekedMessage) -> None:
    if s.in_flight is None and s.next_task is None and s.queued == 0:  # the session's head
        s.waiting_since = m.enqueued_at
        s.deliveries = m.delivery_count
        if m.state == "locked":
            s.in_flight = m.message_id
            s.locked_until = m.locked_until
            return
    if s.next_task is None:
        s.next_task = m.message_id
    s.queued += 1


def summary(statuses: Sequence[DeviceStatus]) -> dict[str, int]:
    return {
        "devices": len(statuses),
        "in_flight": sum(1 for s in statuses if s.in_flight),
        "queued": sum(s.queued for s in statuses),
        "failed": sum(len(s.failed) for s in statuses),
    }

"""What ``outbox devices list|show`` reads: per device (a session of the gateway's queue), whether
it is online and since when, the task out to it with its tries, last try and next try, how many
wait behind it, and the dead-lettered (failed) ones.

Read from the queue's database alone, so it sees every gateway process at once and needs nothing
of theirs: a task is *out* once a gateway published it (its ``delivery_count``, the tries, is
above 0) until the device's ack completes it; its last try is when its lock was taken and its next
try when that lock ends (a gateway holds a task's lock for one retry interval). An offline
device's tasks have no next try: they wait for the device. Presence is what the gateways recorded
from the devices' retained statuses (``unknown``: the device never published one, and counts as
online).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from dispatcher.queue.messages import DeadLetter, PeekedMessage

if TYPE_CHECKING:
    from dispatcher.queue.sql_queue import SqlQueue

UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeviceTask:
    """One task of a device, as ``devices show`` lists it."""

    message_id: str
    #: ``out`` (published, no ack yet), ``waiting`` (behind the one out, or for the device)
    state: str
    tries: int
    last_try: datetime | None
    next_try: datetime | None
    enqueued_at: datetime

    def to_dict(self) -> dict[str, object]:
        return {
            "message_id": self.message_id,
            "state": self.state,
            "tries": self.tries,
            "last_try": self.last_try,
            "next_try": self.next_try,
            "enqueued_at": self.enqueued_at,
        }


@dataclass
class DeviceStatus:
    device: str
    #: ``online``, ``offline`` or ``unknown`` (no status ever seen), and since when
    presence: str = UNKNOWN
    since: datetime | None = None
    #: the task out to the device (None: nothing out)
    in_flight: str | None = None
    #: its publishes so far, the last one, and when the next is due (None: waits for the device)
    tries: int = 0
    last_try: datetime | None = None
    next_try: datetime | None = None
    #: when the head task was enqueued (how long the device has had work waiting)
    waiting_since: datetime | None = None
    #: tasks waiting behind the one out (or all of them, when none is out)
    queued: int = 0
    #: the next task to go out
    next_task: str | None = None
    tasks: list[DeviceTask] = field(default_factory=list)
    failed: list[DeadLetter] = field(default_factory=list)

    def to_dict(self, *, details: bool = False) -> dict[str, object]:
        out: dict[str, object] = {
            "device": self.device,
            "presence": self.presence,
            "since": self.since,
            "in_flight": self.in_flight,
            "tries": self.tries,
            "last_try": self.last_try,
            "next_try": self.next_try,
            "waiting_since": self.waiting_since,
            "queued": self.queued,
            "next_task": self.next_task,
            "failed": len(self.failed),
        }
        if details:
            out["tasks"] = [t.to_dict() for t in self.tasks]
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
    queue: SqlQueue,
    destination: str,
    *,
    limit: int = 10_000,
    device: str | None = None,
) -> list[DeviceStatus]:
    """Every device known on ``destination`` (with a status, tasks queued or failed; the first
    ``limit`` tasks and failures), sorted by device; only ``device`` when given."""
    where = {"session_id": device} if device is not None else None
    peeked = (
        queue.receiver.peek(destination, limit)
        if device is None
        else queue.receiver.peek_session(destination, device, limit)
    )
    messages = [m for m in peeked if m.session_id]
    dead = queue.admin.list_dead_letters(destination, limit, where=where)
    states = queue.sessions.states(destination, None if device is None else [device])
    by_device: dict[str, DeviceStatus] = {}

    def status(name: str) -> DeviceStatus:
        found = by_device.get(name)
        if found is None:
            found = by_device[name] = DeviceStatus(name)
            state = states.get(name)
            if state is not None:
                found.presence = state.state or UNKNOWN
                found.since = state.since
        return found

    for name in states:
        status(name)
    for m in messages:
        assert m.session_id is not None
        _add(status(m.session_id), m)
    for d in dead:
        if d.session_id is not None:
            status(d.session_id).failed.append(d)
    return [by_device[k] for k in sorted(by_device)]


def _add(s: DeviceStatus, m: PeekedMessage) -> None:
    offline = s.presence == "offline"
    head = not s.tasks
    out = head and m.delivery_count > 0 and not offline
    next_try = m.locked_until if out else None
    s.tasks.append(
        DeviceTask(
            message_id=m.message_id,
            state="out" if out else "waiting",
            tries=m.delivery_count,
            last_try=m.locked_at if m.delivery_count else None,
            next_try=next_try,
            enqueued_at=m.enqueued_at,
        )
    )
    if head:
        s.waiting_since = m.enqueued_at
        s.tries = m.delivery_count
        s.last_try = m.locked_at if m.delivery_count else None
        if out:
            s.in_flight = m.message_id
            s.next_try = next_try
            return
    if s.next_task is None:
        s.next_task = m.message_id
    s.queued += 1


def summary(statuses: Sequence[DeviceStatus]) -> dict[str, int]:
    return {
        "devices": len(statuses),
        "online": sum(1 for s in statuses if s.presence == "online"),
        "offline": sum(1 for s in statuses if s.presence == "offline"),
        "in_flight": sum(1 for s in statuses if s.in_flight),
        "queued": sum(s.queued for s in statuses),
        "failed": sum(len(s.failed) for s in statuses),
    }

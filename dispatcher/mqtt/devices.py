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

from sqlalchemy import func, select, union

from dispatcher.queue.messages import DeadLetter, PeekedMessage, as_utc
from migrations.sql.tables import dead_letters as D
from migrations.sql.tables import queue_messages as M
from migrations.sql.tables import queue_sessions as S

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
    #: how many tasks failed, where ``failed`` is not read (``device_page``)
    failed_count: int = 0

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


@dataclass
class DevicePage:
    """One page of ``device_page``: the devices, and the name to continue after (None: last)."""

    devices: list[DeviceStatus]
    next_after: str | None


def device_page(
    queue: SqlQueue,
    destination: str,
    *,
    after: str | None = None,
    limit: int = 50,
    presence: str | None = None,
) -> DevicePage:
    """Up to ``limit`` devices of ``destination`` in name order after ``after``, each with what
    ``device_statuses`` gives but its task lists (the head task only, and counts).

    Why apart from ``device_statuses``: that reads every task of the queue, which a console page
    cannot afford for a fleet of 10,000 devices. This reads a page's names through the indexes
    (the sessions' key, the queue's and the dead letters' per-session indexes), then only those
    devices' head tasks and counts: the same cost at any page. ``presence`` (``online`` or
    ``offline``) lists only the devices with that recorded status."""
    start = after or ""
    take = limit + 1
    named = select(S.c.session_id.label("name")).where(
        S.c.queue == destination, S.c.session_id > start
    )
    if presence is not None:
        names_stmt = named.where(S.c.state == presence).order_by(S.c.session_id).limit(take)
    else:
        parts = [
            named.order_by(S.c.session_id).limit(take),
            select(M.c.session_id.label("name"))
            .where(M.c.queue == destination, M.c.session_id > start)
            .group_by(M.c.session_id)
            .order_by(M.c.session_id)
            .limit(take),
            select(D.c.session_id.label("name"))
            .where(D.c.queue == destination, D.c.session_id > start)
            .group_by(D.c.session_id)
            .order_by(D.c.session_id)
            .limit(take),
        ]
        every = union(*(p.subquery().select() for p in parts)).subquery()
        names_stmt = select(every.c.name).order_by(every.c.name).limit(take)
    db = queue.database
    with db.read("read devices") as conn:
        names = [str(n) for n in conn.execute(names_stmt).scalars()]
        more = len(names) > limit
        names = names[:limit]
        if not names:
            return DevicePage([], None)
        states = conn.execute(
            select(S.c.session_id, S.c.state, S.c.since).where(
                S.c.queue == destination, S.c.session_id.in_(names)
            )
        ).all()
        counts = conn.execute(
            select(M.c.session_id, func.count(), func.min(M.c.sequence_number))
            .where(M.c.queue == destination, M.c.session_id.in_(names))
            .group_by(M.c.session_id)
        ).all()
        heads = {int(c[2]) for c in counts}
        head_rows = (
            conn.execute(
                select(
                    M.c.session_id,
                    M.c.message_id,
                    M.c.delivery_count,
                    M.c.locked_at,
                    M.c.locked_until,
                    M.c.enqueued_at,
                ).where(M.c.sequence_number.in_(list(heads)))
            ).all()
            if heads
            else []
        )
        failed = conn.execute(
            select(D.c.session_id, func.count())
            .where(D.c.queue == destination, D.c.session_id.in_(names))
            .group_by(D.c.session_id)
        ).all()
    by_name = {n: DeviceStatus(n) for n in names}
    for name, state, since in states:
        s = by_name[name]
        s.presence = state or UNKNOWN
        s.since = as_utc(since)
    queued = {str(name): int(n) for name, n, _ in counts}
    for row in head_rows:
        s = by_name[row.session_id]
        tries = int(row.delivery_count)
        s.waiting_since = as_utc(row.enqueued_at)
        s.tries = tries
        s.last_try = as_utc(row.locked_at) if tries else None
        if tries > 0 and s.presence != "offline":
            s.in_flight = row.message_id
            s.next_try = as_utc(row.locked_until)
            s.queued = queued.get(row.session_id, 1) - 1
        else:
            s.next_task = row.message_id
            s.queued = queued.get(row.session_id, 0)
    failures = {str(name): int(n) for name, n in failed}
    devices = [by_name[n] for n in names]
    for s in devices:
        s.failed_count = failures.get(s.device, 0)
    return DevicePage(devices, names[-1] if more else None)


def presence_counts(queue: SqlQueue) -> dict[str, dict[str, int]]:
    """Per queue, how many devices are ``online``/``offline`` (recorded statuses only)."""
    out: dict[str, dict[str, int]] = {}
    with queue.database.read("count devices") as conn:
        rows = conn.execute(
            select(S.c.queue, S.c.state, func.count()).group_by(S.c.queue, S.c.state)
        ).all()
    for name, state, n in rows:
        out.setdefault(str(name), {})[str(state or UNKNOWN)] = int(n)
    return out

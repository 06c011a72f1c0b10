"""What a fleet's devices are: their options, each device's live state and its record, the
fleet's error, and the descriptor room a fleet of sockets needs."""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass, field
from typing import Final, TypedDict

MESSAGE_ID: Final = "outbox-message-id"
BEHAVIOURS: Final = ("ack", "silent", "offline")
ONLINE: Final = b"online"
OFFLINE: Final = b"offline"


#: select()'s FD_SETSIZE. The devices' sockets take numbers above it when the limit allows, so a
#: select()-based client in the same process (paho: the gateway under test) still gets one below.
FD_FLOOR: Final = 1024
CONNECT_ATTEMPTS: Final = 5  # a refused or reset connect is tried again: a busy broker drops some
HANDSHAKE_TIMEOUT: Final = 60.0  # CONNECT to the status PUBACK, per attempt


class FleetError(RuntimeError):
    """A device could not come up (the broker refused it, or kept dropping it)."""


@dataclass(frozen=True)
class FleetOptions:
    """The devices' topics (templates with ``{session}``), how long an acking device works before
    it acks (``ack_delay``, seconds), the MQTT keepalive (seconds), how many connects are in flight
    at once (a broker's listen backlog drops a flood of them) and the client id prefix."""

    topic: str = "devices/{session}/tasks"
    ack_topic: str = "devices/{session}/tasks/ack"
    status_topic: str = "devices/{session}/status"
    ack_delay: float = 0.0
    keepalive: int = 60
    connect_concurrency: int = 256
    client_prefix: str = ""


class FleetKeywords(TypedDict, total=False):
    """``FleetOptions``' fields as ``DeviceFleet``'s keyword arguments."""

    topic: str
    ack_topic: str
    status_topic: str
    ack_delay: float
    keepalive: int
    connect_concurrency: int
    client_prefix: str


@dataclass(slots=True)
class DeviceRecord:
    """What one device saw and did (a copy: it does not change after ``record`` returns it)."""

    device: str
    behaviour: str
    #: task ids in the order they first arrived
    tasks: list[str] = field(default_factory=list)
    #: ids it acked, in order, repeats included
    acked: list[str] = field(default_factory=list)
    #: arrivals of an id it already had (re-publishes)
    repeats: int = 0
    #: the most distinct tasks it held unacked at one moment: 1 is the gateway's promise
    max_in_flight: int = 0
    #: ``time.monotonic()`` of the first task's arrival and of the last ack
    first_task_at: float | None = None
    last_ack_at: float | None = None
    #: connected now (``offline`` devices: false once dropped)
    online: bool = False
    #: connections the broker closed without being asked to
    lost_connections: int = 0


class Device:
    """One device's live state, touched by the event loop under the fleet's lock."""

    __slots__ = (
        "ack_times",
        "acked",
        "behaviour",
        "done",
        "epoch",
        "first_task_at",
        "in_flight",
        "last_ack_at",
        "last_sent",
        "lost",
        "max_in_flight",
        "name",
        "next_pid",
        "online",
        "repeats",
        "runner",
        "tasks",
        "wanted",
        "writer",
    )

    def __init__(self, name: str, behaviour: str) -> None:
        self.name = name
        self.behaviour = behaviour
        self.tasks: dict[str, None] = {}  # an ordered set: arrival order, quick membership
        self.acked: list[str] = []
        self.ack_times: list[float] = []  # when each distinct task was acked (for ``done_at``)
        self.done: set[str] = set()
        self.in_flight: set[str] = set()
        self.repeats = 0
        self.max_in_flight = 0
        self.first_task_at: float | None = None
        self.last_ack_at: float | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.runner: asyncio.Task[None] | None = None
        self.next_pid = 0
        self.last_sent = 0.0
        self.epoch = 0  # bumped when it drops: acks scheduled before are lost with it
        self.wanted = True  # false once told to drop: the connection's end is then no loss
        self.online = False
        self.lost = 0

    def pid(self) -> int:
        self.next_pid = self.next_pid % 0xFFFF + 1
        return self.next_pid


def file_floor(needed: int) -> int:
    """Make room for ``needed`` descriptors (the soft limit raised to the hard one if short, room
    for ``FD_FLOOR`` more wanted too); the lowest number the devices' sockets should take."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft != infinite and soft < needed + FD_FLOOR and hard != soft:
        soft = hard if hard != infinite else needed + FD_FLOOR
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != infinite and soft < needed:
        raise FleetError(
            f"{needed} file descriptors needed, the hard limit is {hard}: raise it "
            "(ulimit -Hn, or LimitNOFILE=) or simulate fewer devices"
        )
    return FD_FLOOR if soft == infinite or soft >= needed + FD_FLOOR else 0

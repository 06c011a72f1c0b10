"""A simulator of devices that handle one task at a time and ack each on a reply topic.

Why it ships: a gateway's promise to such devices (never a second task before the first is acked,
tasks in order, a lost ack answered by a re-publish of the same id) is only believable when
checked from the devices' side. ``DeviceSimulator`` plays any number of devices over one MQTT
connection and records, per device, every task it received and **how many it had unacked at any
moment** (``max_in_flight``), so a test asserts the promise instead of the gateway's own story.

Each device can be told to misbehave the way real ones do: drop an ack (``drop_rate``: the device
did the task, the ack got lost), ack twice (``twice_rate``), ack an id it never got
(``unknown_rate``), or go offline and come back (``offline``/``online``: while offline it
receives nothing, and a task it held is lost with it). A device is idempotent, as the pattern
assumes: a re-published task it already did is acked again at once and is not a second task in
flight. With ``status_topic`` set, ``offline``/``online`` also publish the device's retained
status there, as a device's Last Will and its first publish do (dispatcher/mqtt/presence.py);
the repository's ``testkit.fleet`` (not shipped) plays devices with a connection and a Last Will
each.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypedDict, Unpack

from dispatcher.mqtt.acks import ack_payload, session_matcher
from dispatcher.mqtt.client import MqttBroker, MqttConnection, Publish
from dispatcher.mqtt.transport import MESSAGE_ID, check_template

if TYPE_CHECKING:
    from paho.mqtt.client import MQTTMessage


@dataclass
class DeviceRecord:
    """What one device saw and did."""

    device: str
    #: task ids in the order they first arrived
    tasks: list[str] = field(default_factory=list)
    #: ids it acked (the ack published, in order; repeats included)
    acked: list[str] = field(default_factory=list)
    #: ids whose ack it "lost" (done, but the ack never left)
    dropped: list[str] = field(default_factory=list)
    #: arrivals of an id it already had or had done (re-publishes)
    repeats: int = 0
    #: tasks received while offline (never seen by the device)
    missed: int = 0
    #: the most tasks it held unacked at one moment: 1 is the promise
    max_in_flight: int = 0
    in_flight: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    #: bumped when the device goes offline: acks it had scheduled are lost with it
    epoch: int = 0


@dataclass(frozen=True)
class SimulatorOptions:
    """The devices' topics (each with ``{session}``, the device), how long a device works before
    it acks (``ack_delay``), how it misbehaves (see the module's docstring; ``seed`` replays the
    dice) and which devices start offline."""

    topic: str = "devices/{session}/tasks"
    ack_topic: str = "devices/{session}/tasks/ack"
    ack_delay: float = 0.01
    drop_rate: float = 0.0
    twice_rate: float = 0.0
    unknown_rate: float = 0.0
    seed: int = 0
    offline: Iterable[str] = ()
    status_topic: str | None = None


class SimulatorKeywords(TypedDict, total=False):
    """``SimulatorOptions``' fields as ``DeviceSimulator``'s keyword arguments."""

    topic: str
    ack_topic: str
    ack_delay: float
    drop_rate: float
    twice_rate: float
    unknown_rate: float
    seed: int
    offline: Iterable[str]
    status_topic: str | None


class DeviceSimulator:
    """Devices on one MQTT connection; ``with DeviceSimulator(url) as sim:`` starts and stops it."""

    def __init__(
        self,
        broker: MqttBroker | str,
        *,
        options: SimulatorOptions | None = None,
        **keywords: Unpack[SimulatorKeywords],
    ) -> None:
        """``options`` (``SimulatorOptions``), and any of its fields as a keyword over it."""
        opts = replace(options or SimulatorOptions(), **keywords)
        self.broker = MqttBroker.parse(broker) if isinstance(broker, str) else broker
        self.topic = check_template(opts.topic, name="topic")
        self.ack_topic = check_template(opts.ack_topic, name="ack topic")
        if "{session}" not in opts.topic or "{session}" not in opts.ack_topic:
            raise ValueError("the task and ack topics must both contain {session}")
        self.ack_delay = opts.ack_delay
        self.drop_rate = opts.drop_rate
        self.twice_rate = opts.twice_rate
        self.unknown_rate = opts.unknown_rate
        self._random = random.Random(opts.seed)
        self._match = session_matcher(opts.topic)
        self._records: dict[str, DeviceRecord] = {}
        self._offline = set(opts.offline)
        self.status_topic = opts.status_topic
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, str, str, int]] = []  # (due, n, device, id, epoch)
        self._n = itertools.count()
        self._stop = False
        self._acker = threading.Thread(target=self._ack_loop, name="device-acks", daemon=True)
        self.unknown_acks = 0
        self.conn: MqttConnection | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> DeviceSimulator:
        self.conn = MqttConnection(
            self.broker,
            client_id=f"device-sim-{self._random.randrange(1 << 30)}",
            subscriptions=[self.topic.replace("{session}", "+")],
            on_message=self._on_task,
        )
        self._acker.start()
        for device in sorted(self._offline):
            self._status(device, "offline")
        return self

    def __enter__(self) -> DeviceSimulator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._changed:
            self._stop = True
            self._changed.notify_all()
        if self._acker.is_alive():
            self._acker.join()
        if self.conn is not None:
            self.conn.close()

    # --- scenario controls --------------------------------------------------------------------

    def offline(self, device: str) -> None:
        """The device drops off: it receives nothing, and the task it held is lost."""
        with self._changed:
            self._offline.add(device)
            rec = self.record(device)
            rec.in_flight.clear()
            rec.epoch += 1
        self._status(device, "offline")

    def online(self, device: str) -> None:
        with self._changed:
            self._offline.discard(device)
        self._status(device, "online")

    def _status(self, device: str, state: str) -> None:
        if self.status_topic is not None and self.conn is not None:
            topic = self.status_topic.replace("{session}", device)
            self.conn.publish([Publish(topic, state.encode(), label=device, retain=True)])

    # --- what happened ------------------------------------------------------------------------

    def record(self, device: str) -> DeviceRecord:
        """The device's record (created on first use; read it under no lock only when idle)."""
        rec = self._records.get(device)
        if rec is None:
            rec = self._records[device] = DeviceRecord(device)
        return rec

    def records(self) -> dict[str, DeviceRecord]:
        with self._changed:
            return dict(self._records)

    def max_in_flight(self) -> int:
        with self._changed:
            return max((r.max_in_flight for r in self._records.values()), default=0)

    def wait_for(self, condition: Callable[[DeviceSimulator], bool], timeout: float) -> bool:
        """Wait until ``condition(self)`` holds (checked at every event), at most ``timeout`` s."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)

    # --- the devices (network thread and ack thread) ------------------------------------------

    def _on_task(self, message: MQTTMessage) -> None:
        device = self._match(message.topic)
        props = getattr(message, "properties", None)
        ids = dict(getattr(props, "UserProperty", None) or [])
        task = ids.get(MESSAGE_ID) or bytes(message.payload).decode("utf-8", "replace")
        if device is None:
            return
        with self._changed:
            rec = self.record(device)
            if device in self._offline:
                rec.missed += 1
            elif task in rec.done:  # idempotent: a repeat of a done task is acked again at once
                rec.repeats += 1
                self._schedule(0.0, device, task)
            elif task in rec.in_flight:
                rec.repeats += 1  # the pending ack answers it
            else:  # new, or lost when the device went offline: it takes the task (again)
                if task in rec.tasks:
                    rec.repeats += 1
                else:
                    rec.tasks.append(task)
                rec.in_flight.add(task)
                rec.max_in_flight = max(rec.max_in_flight, len(rec.in_flight))
                self._schedule(self.ack_delay, device, task)
            self._changed.notify_all()

    def _schedule(self, delay: float, device: str, task: str) -> None:
        epoch = self.record(device).epoch
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._n), device, task, epoch))
        self._changed.notify_all()

    def _ack_loop(self) -> None:
        while True:
            with self._changed:
                while not self._stop and (not self._due or self._due[0][0] > time.monotonic()):
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(wait)  # the device's own work time, or a new task
                if self._stop:
                    return
                _, _, device, task, epoch = heapq.heappop(self._due)
                rec = self.record(device)
                if device in self._offline or epoch != rec.epoch:
                    continue  # offline now, or went offline since: the task was lost with it
                rec.in_flight.discard(task)
                rec.done.add(task)
                out: list[tuple[str, str]] = []
                if self._random.random() < self.drop_rate:
                    rec.dropped.append(task)
                else:
                    copies = 2 if self._random.random() < self.twice_rate else 1
                    out += [(device, task)] * copies
                    rec.acked += [task] * copies
                if self._random.random() < self.unknown_rate:
                    self.unknown_acks += 1
                    out.append((device, f"unknown-{self._random.randrange(1 << 30)}"))
                self._changed.notify_all()
            assert self.conn is not None
            for dev, mid in out:
                self.conn.publish_nowait(self.ack_topic.replace("{session}", dev), ack_payload(mid))

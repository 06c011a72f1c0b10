"""A fleet of simulated MQTT devices, each on its own connection, all in one Python process.

Why it exists: ``DeviceSimulator`` plays every device over one shared connection, which cannot show
what a gateway meets in the field: one session, one Last Will and one retained status per device,
and a broker holding thousands of connections. ``DeviceFleet`` opens one MQTT 5 connection per
device on raw ``asyncio`` streams (a paho client per device would cost a thread and a socket pair
each; 10,000 of them would not fit), so a test can bring up 10,000 devices on one event loop.

Why one module: the packet codec (a hundred lines of MQTT 5 framing) serves only these devices and
is no client anyone else should use; split out, it would be half a client with no owner.

The device contract it plays (the gateway relies on it). Topics are templates in which
``{session}`` is the device id; the defaults are ``devices/{session}/tasks`` (tasks),
``devices/{session}/tasks/ack`` (acks) and ``devices/{session}/status`` (status).

- A device connects with client id ``{prefix}{device}``, clean start, a keepalive (60 s by
  default) and a Last Will on its status topic: payload ``offline``, QoS 1, retained.
- Once the broker accepts it (CONNACK reason 0), it subscribes to its own task topic at QoS 1 and
  then publishes ``online``, retained, QoS 1, on its status topic.
- A task is a PUBLISH (QoS 1) on its task topic. Its message id is the MQTT 5 user property
  ``outbox-message-id`` (else the payload, as UTF-8). The device PUBACKs every task.
- To ack a task it publishes ``{"message_id": "<id>"}`` on its ack topic at QoS 1.
- Behaviours: ``"ack"`` acks each new task after ``ack_delay`` seconds (0: at once) and a task
  it already acked again at once (counted in ``repeats``, not as a new task); ``"silent"`` receives
  and PUBACKs tasks but never acks them; ``"offline"`` connects and publishes ``online`` like the
  others, then drops its TCP connection without a DISCONNECT, so the broker publishes its will
  (``offline``), and stays away until ``reconnect``.
- ``go_offline(device)`` drops any connected device the same abrupt way (its will fires; an ack it
  had scheduled is lost with it); ``reconnect(device)`` connects it again and publishes ``online``
  (a device that started ``"offline"`` comes back acking).
- Each device records its tasks and acks, and the most distinct tasks it held unacked at once
  (``max_in_flight``): 1 for an acking device unless the gateway broke its one-at-a-time promise.
- ``close()`` sends DISCONNECT on every connection (no will fires) and publishes nothing more.

Use::

    with DeviceFleet("mqtt://127.0.0.1:1883", {f"d{i}": "ack" for i in range(10_000)}) as fleet:
        ...  # the gateway sends one task to each device
        assert fleet.wait_for(lambda f: f.acked_count() == 10_000, timeout=120)

The devices run on an event loop in one daemon thread; the methods are called from any other
thread. Only the protocol a device needs is spoken: QoS 0/1 (no QoS 2), no topic aliases (the
CONNECT allows none), no reconnect on a lost connection (it is counted in ``lost_connections``).
Idle devices send PINGREQ from one timer for the whole fleet, not one each.

Descriptors: each device holds a socket, so ``start`` raises the soft ``RLIMIT_NOFILE`` to the hard
one when short (and fails, saying so, when the hard one is too low). The sockets take numbers from
1024 up when the limit allows: paho's network loop uses ``select()``, which cannot watch a socket
numbered 1024 or more, so a paho gateway in the same process connecting after the fleet would
otherwise retry forever without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import resource
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypedDict, TypeVar, Unpack

from dispatcher.mqtt.client import MqttBroker, mqtt_string, mqtt_varint

MESSAGE_ID: Final = "outbox-message-id"
BEHAVIOURS: Final = ("ack", "silent", "offline")
ONLINE: Final = b"online"
OFFLINE: Final = b"offline"

# Packet types (MQTT 5, 2.1.2), the high nibble of a packet's first byte.
CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14
PINGREQ_PACKET: Final = b"\xc0\x00"
DISCONNECT_PACKET: Final = b"\xe0\x00"  # reason 0, normal disconnection: the will is dropped
USER_PROPERTY: Final = 0x26
# Property ids by value type (MQTT 5, 2.2.2.2): anything else is a UTF-8 string or binary data
# (2-byte length, then the bytes), or the user property (two of those).
BYTE_PROPS: Final = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
TWO_BYTE_PROPS: Final = frozenset({0x13, 0x21, 0x22, 0x23})
FOUR_BYTE_PROPS: Final = frozenset({0x02, 0x11, 0x18, 0x27})
VBI_PROPS: Final = frozenset({0x0B})
LENGTH_PROPS: Final = frozenset({0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F})

_T = TypeVar("_T")

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


class _Device:
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


class DeviceFleet:
    """Many MQTT 5 devices, one connection each; ``with DeviceFleet(url, behaviours) as fleet:``."""

    def __init__(
        self,
        broker_url: str,
        behaviours: Mapping[str, str],
        options: FleetOptions | None = None,
        **keywords: Unpack[FleetKeywords],
    ) -> None:
        """``behaviours``: device id -> ``"ack"``, ``"silent"`` or ``"offline"``; ``options``
        (``FleetOptions``), and any of its fields as a keyword over it."""
        self.options = opts = replace(options or FleetOptions(), **keywords)
        self.broker = MqttBroker.parse(broker_url)
        for name, template in (
            ("topic", opts.topic),
            ("ack_topic", opts.ack_topic),
            ("status_topic", opts.status_topic),
        ):
            if "{session}" not in template or any(c in template for c in "+#"):
                raise ValueError(f"{name} {template!r} must contain {{session}} and no wildcard")
        bad = {d: b for d, b in behaviours.items() if b not in BEHAVIOURS}
        if bad:
            raise ValueError(f"unknown behaviours {bad} (use one of {', '.join(BEHAVIOURS)})")
        odd = [d for d in behaviours if not d or any(c in d for c in "+#/")]
        if odd:
            raise ValueError(f"device ids must be one non-empty topic level: {odd[:5]}")
        if opts.keepalive < 1 or opts.connect_concurrency < 1:
            raise ValueError("keepalive and connect_concurrency must be at least 1")
        self._devices = {name: _Device(name, b) for name, b in behaviours.items()}
        self._changed = threading.Condition()
        self._up = 0  # devices brought up (offline ones: dropped) since start
        self._acked_total = 0  # distinct tasks acked, all devices
        self._lost_total = 0
        self._failure: str | None = None
        self._closing = False
        self._notify_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gate: asyncio.Semaphore | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._ssl = self._ssl_context()
        self._fd_floor = 0
        self._address: tuple[int, Any] = (socket.AF_INET, (self.broker.host, self.broker.port))

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 300) -> DeviceFleet:
        """Bring every device up and return once each is connected, subscribed and has its
        ``online`` acknowledged by the broker (``offline`` devices: once dropped again)."""
        if self._thread is not None:
            raise RuntimeError("the fleet was started already")
        self._fd_floor = _file_floor(len(self._devices) + 100)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="device-fleet", daemon=True)
        self._thread.start()
        self._call(self._start_all()).result()
        with self._changed:
            total = len(self._devices)
            self._changed.wait_for(lambda: self._up >= total or self._failure is not None, timeout)
            up, failure = self._up, self._failure
        if failure is not None or up < total:
            self.close()
            if failure is not None:
                raise FleetError(f"{up} of {total} devices came up; {failure}")
            raise TimeoutError(f"only {up} of {total} devices came up within {timeout:g}s")
        return self

    def close(self) -> None:
        """DISCONNECT every device (no will fires), stop the loop and join its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._closing:
            return
        self._closing = True
        with contextlib.suppress(TimeoutError):
            self._call(self._close_all()).result(timeout=120)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> DeviceFleet:
        """Starts the fleet unless ``start`` did (``with DeviceFleet(...).start(60) as f:``)."""
        return self if self._thread is not None else self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- scenario controls --------------------------------------------------------------------

    def go_offline(self, device: str, timeout: float = 30) -> None:
        """Drop the device's TCP connection without a DISCONNECT: the broker publishes its will."""
        self._call(self._drop(self._device(device))).result(timeout)

    def reconnect(self, device: str, behaviour: str | None = None, timeout: float = 60) -> None:
        """Connect a dropped device again (``online`` published and acknowledged on return). It
        keeps its behaviour, or takes ``behaviour``; an ``"offline"`` one comes back acking unless
        told ``"offline"`` again (then it drops at once, as at start: a flapping device)."""
        dev = self._device(device)
        if behaviour is not None and behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        self._call(self._reconnect(dev, behaviour)).result(timeout)

    # --- what happened ------------------------------------------------------------------------

    def record(self, device: str) -> DeviceRecord:
        dev = self._device(device)
        with self._changed:
            return DeviceRecord(
                device=dev.name,
                behaviour=dev.behaviour,
                tasks=list(dev.tasks),
                acked=list(dev.acked),
                repeats=dev.repeats,
                max_in_flight=dev.max_in_flight,
                first_task_at=dev.first_task_at,
                last_ack_at=dev.last_ack_at,
                online=dev.online,
                lost_connections=dev.lost,
            )

    def acked_count(self, devices: Iterable[str] | None = None) -> int:
        """Distinct tasks acked by ``devices`` (None: all, a counter cheap in a wait predicate)."""
        with self._changed:
            if devices is None:
                return self._acked_total
            return sum(len(self._device(d).done) for d in devices)

    def max_in_flight(self) -> int:
        """The most distinct tasks any device held unacked at once."""
        with self._changed:
            return max((d.max_in_flight for d in self._devices.values()), default=0)

    @property
    def lost_connections(self) -> int:
        """Connections the broker closed on its own, all devices (0 in a healthy run)."""
        with self._changed:
            return self._lost_total

    def wait_for(self, condition: Callable[[DeviceFleet], bool], timeout: float) -> bool:
        """Wait until ``condition(self)`` holds, re-checked whenever a task or an ack arrives."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self), timeout)

    def done_at(self, devices: Iterable[str], tasks_each: int) -> float | None:
        """``time.monotonic()`` when the last of ``devices`` acked its ``tasks_each``-th distinct
        task, or None while one has not."""
        latest = 0.0
        with self._changed:
            for name in devices:
                times = self._device(name).ack_times
                if len(times) < tasks_each:
                    return None
                latest = max(latest, times[tasks_each - 1])
        return latest

    # --- plumbing (caller's thread) -----------------------------------------------------------

    def _device(self, name: str) -> _Device:
        try:
            return self._devices[name]
        except KeyError:
            raise KeyError(f"no device {name!r} in this fleet") from None

    def _call(self, coro: Coroutine[Any, Any, _T]) -> Future[_T]:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the fleet is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.broker.tls:
            return None
        context = ssl.create_default_context(cafile=self.broker.ca_file)
        if self.broker.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    # --- the event loop's side ----------------------------------------------------------------

    async def _start_all(self) -> None:
        self._gate = asyncio.Semaphore(self.options.connect_concurrency)
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(
            self.broker.host, self.broker.port, type=socket.SOCK_STREAM
        )  # once, not once per device
        self._address = (found[0][0], found[0][4])
        for dev in self._devices.values():
            dev.runner = asyncio.create_task(self._session(dev))
        self._pinger = asyncio.create_task(self._ping_idle())

    async def _close_all(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        runners = []
        for dev in self._devices.values():
            dev.wanted = False
            if dev.writer is not None and not dev.writer.is_closing():
                dev.writer.write(DISCONNECT_PACKET)
                dev.writer.close()  # flushes the DISCONNECT first
            if dev.runner is not None:
                runners.append(dev.runner)
        if not runners:
            return
        # A connected device ends when the broker closes its side; one still connecting sends its
        # DISCONNECT once up (``_session``).
        _, pending = await asyncio.wait(runners, timeout=30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _session(self, dev: _Device) -> None:
        """One connection's life: connect (retrying a few times), come up, serve until it ends."""
        try:
            reader = await self._come_up(dev)
        except FleetError as e:
            with self._changed:
                self._failure = self._failure or str(e)
            self._notify()
            return
        if reader is None:  # the fleet closed meanwhile
            return
        if self._closing and dev.writer is not None:  # came up while the fleet closed
            self._send(dev, DISCONNECT_PACKET)
            dev.writer.close()
            dev.writer = None
            return
        if dev.behaviour == "offline":
            dev.wanted = False
            self._abort(dev)
            self._count_up()
            return
        self._count_up()
        await self._serve(dev, reader)

    async def _come_up(self, dev: _Device) -> asyncio.StreamReader | None:
        assert self._gate is not None
        why = ""
        for attempt in range(CONNECT_ATTEMPTS):
            if self._closing:
                return None
            try:
                async with self._gate, asyncio.timeout(HANDSHAKE_TIMEOUT):
                    return await self._handshake(dev)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
                why = f"{type(e).__name__}: {e}"
                self._abort(dev)
                await asyncio.sleep(0.2 * 2**attempt)
            except FleetError:  # refused: trying again would not help
                self._abort(dev)
                raise
        raise FleetError(f"device {dev.name}: no connection after {CONNECT_ATTEMPTS} tries ({why})")

    async def _handshake(self, dev: _Device) -> asyncio.StreamReader:
        """CONNECT with the will, SUBSCRIBE to the tasks, publish ``online``: each answered."""
        reader, writer = await asyncio.open_connection(
            sock=await self._connected_socket(),
            ssl=self._ssl,
            server_hostname=self.broker.host if self._ssl else None,
        )
        dev.writer, dev.wanted = writer, True
        self._send(dev, self._connect_packet(dev.name))
        first, body = await _read_packet(reader)
        if first >> 4 != CONNACK or len(body) < 2:
            raise FleetError(f"device {dev.name}: expected a CONNACK, got packet type {first >> 4}")
        if body[1] != 0:
            raise FleetError(f"device {dev.name}: the broker refused it (reason 0x{body[1]:02x})")
        pid = dev.pid()
        topic = mqtt_string(self._topic(self.options.topic, dev.name))
        self._send(
            dev, _packet(SUBSCRIBE << 4 | 0x02, struct.pack("!HB", pid, 0) + topic + b"\x01")
        )
        body = await self._until(dev, reader, SUBACK, pid)
        if len(body) < 4 or body[-1] >= 0x80:
            raise FleetError(f"device {dev.name}: the broker refused its subscription")
        pid = self._publish(dev, self.options.status_topic, ONLINE, retain=True)
        body = await self._until(dev, reader, PUBACK, pid)
        if len(body) > 2 and body[2] >= 0x80:
            raise FleetError(f"device {dev.name}: the broker refused its status (0x{body[2]:02x})")
        with self._changed:
            dev.online = True
        return reader

    async def _connected_socket(self) -> socket.socket:
        """A socket connected to the broker, numbered above ``FD_FLOOR`` when the limit allows."""
        family, address = self._address
        sock = socket.socket(family, socket.SOCK_STREAM)
        if self._fd_floor:
            try:
                high = fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, self._fd_floor)
            finally:
                sock.close()
            sock = socket.socket(family, socket.SOCK_STREAM, fileno=high)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _until(
        self, dev: _Device, reader: asyncio.StreamReader, kind: int, pid: int
    ) -> bytes:
        """Handle packets until the answer ``kind`` to packet id ``pid`` arrives; its body."""
        while True:
            first, body = await _read_packet(reader)
            if first >> 4 == kind and body[:2] == struct.pack("!H", pid):
                return body
            self._handle(dev, first, body)

    async def _serve(self, dev: _Device, reader: asyncio.StreamReader) -> None:
        writer = dev.writer
        assert writer is not None
        try:
            while True:
                first, body = await _read_packet(reader)
                self._handle(dev, first, body)
                if writer.transport.get_write_buffer_size():
                    await writer.drain()  # a broker reading slowly must not grow our buffers
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with self._changed:
                dev.online = False
                if dev.wanted and not self._closing:
                    dev.lost += 1
                    self._lost_total += 1
                    dev.epoch += 1
                    dev.in_flight.clear()
            if dev.writer is writer:
                dev.writer = None
            writer.close()
            self._notify()

    async def _drop(self, dev: _Device) -> None:
        if dev.writer is None:
            raise RuntimeError(f"device {dev.name} is not connected")
        dev.wanted = False
        with self._changed:
            dev.epoch += 1
            dev.in_flight.clear()  # the task it held is lost with it
        self._abort(dev)
        if dev.runner is not None:
            await asyncio.gather(dev.runner, return_exceptions=True)

    async def _reconnect(self, dev: _Device, behaviour: str | None) -> None:
        if dev.writer is not None:
            raise RuntimeError(f"device {dev.name} is connected")
        if dev.runner is not None:
            await asyncio.gather(dev.runner, return_exceptions=True)
        with self._changed:
            dev.behaviour = behaviour or ("ack" if dev.behaviour == "offline" else dev.behaviour)
        reader = await self._come_up(dev)
        if reader is None:
            return
        if dev.behaviour == "offline":  # told so: a flap (up, ``online``, gone again)
            dev.wanted = False
            self._abort(dev)
            return
        dev.runner = asyncio.create_task(self._serve(dev, reader))

    async def _ping_idle(self) -> None:
        """PINGREQ from each device idle for half its keepalive: a broker drops a client silent
        for 1.5 keepalives. One task for all devices, instead of a timer each."""
        half = self.options.keepalive / 2
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(half / 2)
            now = loop.time()
            for dev in self._devices.values():
                if dev.writer is not None and now - dev.last_sent >= half:
                    self._send(dev, PINGREQ_PACKET)

    # --- packets ------------------------------------------------------------------------------

    def _handle(self, dev: _Device, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == PUBLISH:
            self._on_publish(dev, first, body)
        elif kind == DISCONNECT:  # the broker ends the session (a takeover, a shutdown)
            self._abort(dev)
        # PUBACKs of acks, PINGRESPs: nothing to do

    def _on_publish(self, dev: _Device, first: int, body: bytes) -> None:
        qos = (first >> 1) & 0x03
        (size,) = struct.unpack_from("!H", body)
        topic = body[2 : 2 + size].decode("utf-8", "replace")
        pos = 2 + size
        if qos:
            self._send(dev, b"\x40\x02" + body[pos : pos + 2])  # PUBACK, reason 0 (short form)
            pos += 2
        length, pos = _read_vbi(body, pos)
        user = _user_properties(body[pos : pos + length])
        if topic != self._topic(self.options.topic, dev.name):
            return
        task = user.get(MESSAGE_ID)
        if task is None:
            task = body[pos + length :].decode("utf-8", "replace")
        self._on_task(dev, task)

    def _on_task(self, dev: _Device, task: str) -> None:
        """Take a task: a repeat of a done one is acked again at once, a new one after the delay."""
        ack_now = False
        with self._changed:
            if dev.first_task_at is None:
                dev.first_task_at = time.monotonic()
            if task in dev.done:
                dev.repeats += 1
                ack_now = dev.behaviour == "ack"
            elif task in dev.in_flight:
                dev.repeats += 1  # the pending ack answers it
            else:
                if task in dev.tasks:
                    dev.repeats += 1  # lost when the device dropped: it takes it again
                else:
                    dev.tasks[task] = None
                dev.in_flight.add(task)
                dev.max_in_flight = max(dev.max_in_flight, len(dev.in_flight))
                if dev.behaviour == "ack":
                    if self.options.ack_delay > 0:
                        assert self._loop is not None
                        self._loop.call_later(
                            self.options.ack_delay, self._ack, dev, task, dev.epoch
                        )
                    else:
                        ack_now = True
        self._notify()
        if ack_now:
            self._ack(dev, task, dev.epoch)

    def _ack(self, dev: _Device, task: str, epoch: int) -> None:
        if self._closing or dev.epoch != epoch or dev.writer is None:
            return  # closing, or dropped since the task came: the ack is lost with the device
        now = time.monotonic()
        with self._changed:
            dev.in_flight.discard(task)
            if task not in dev.done:
                dev.done.add(task)
                dev.ack_times.append(now)
                self._acked_total += 1
            dev.acked.append(task)
            dev.last_ack_at = now
        self._publish(dev, self.options.ack_topic, json.dumps({"message_id": task}).encode())
        self._notify()

    def _publish(self, dev: _Device, template: str, payload: bytes, *, retain: bool = False) -> int:
        """A QoS 1 PUBLISH (no properties) on the device's ``template`` topic; its packet id."""
        pid = dev.pid()
        topic = mqtt_string(self._topic(template, dev.name))
        body = topic + struct.pack("!HB", pid, 0) + payload
        self._send(dev, _packet(0x32 | int(retain), body))
        return pid

    def _connect_packet(self, device: str) -> bytes:
        """CONNECT: MQTT 5, clean start, the will (``offline``, QoS 1, retained) on its status."""
        flags = 0x02 | 0x04 | 0x08 | 0x20  # clean start, will, will QoS 1, will retain
        user, password = self.broker.username, self.broker.password
        if user is not None:
            flags |= 0x80
        if password is not None:
            flags |= 0x40
        header = mqtt_string("MQTT") + struct.pack("!BBHB", 5, flags, self.options.keepalive, 0)
        payload = (
            mqtt_string(self.options.client_prefix + device)
            + b"\x00"  # will properties: none
            + mqtt_string(self._topic(self.options.status_topic, device))
            + _encode_bytes(OFFLINE)
        )
        if user is not None:
            payload += mqtt_string(user)
        if password is not None:
            payload += mqtt_string(password)
        return _packet(CONNECT << 4, header + payload)

    def _send(self, dev: _Device, data: bytes) -> None:
        writer = dev.writer
        if writer is not None and not writer.is_closing():
            writer.write(data)
            dev.last_sent = asyncio.get_running_loop().time()

    def _abort(self, dev: _Device) -> None:
        """Close the socket at once, no DISCONNECT: to the broker the device just vanished."""
        writer, dev.writer = dev.writer, None
        with self._changed:
            dev.online = False
        if writer is not None:
            writer.transport.abort()

    def _count_up(self) -> None:
        with self._changed:
            self._up += 1
        self._notify()

    def _notify(self) -> None:
        """Wake the waiters once per loop iteration, however many events it handled."""
        if self._notify_pending or self._loop is None:
            return
        self._notify_pending = True
        self._loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._notify_pending = False
        with self._changed:
            self._changed.notify_all()

    @staticmethod
    def _topic(template: str, device: str) -> str:
        return template.replace("{session}", device)


def _file_floor(needed: int) -> int:
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


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One packet: its first byte (type and flags) and its body."""
    head = await reader.readexactly(2)
    length, byte, shift = head[1] & 0x7F, head[1], 7
    while byte & 0x80:
        if shift > 21:
            raise OSError("malformed remaining length")
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
    return head[0], (await reader.readexactly(length) if length else b"")


def _read_vbi(data: bytes, pos: int) -> tuple[int, int]:
    """A variable byte integer at ``pos``: its value and the position after it."""
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + mqtt_varint(len(body)) + body


def _encode_bytes(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def _user_properties(props: bytes) -> dict[str, str]:
    """The user properties among a packet's properties (the others skipped by their type)."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(props):
        ident = props[pos]
        pos += 1
        if ident in BYTE_PROPS:
            pos += 1
        elif ident in TWO_BYTE_PROPS:
            pos += 2
        elif ident in FOUR_BYTE_PROPS:
            pos += 4
        elif ident in VBI_PROPS:
            _, pos = _read_vbi(props, pos)
        elif ident in LENGTH_PROPS:
            (size,) = struct.unpack_from("!H", props, pos)
            pos += 2 + size
        elif ident == USER_PROPERTY:
            (size,) = struct.unpack_from("!H", props, pos)
            key = props[pos + 2 : pos + 2 + size].decode("utf-8", "replace")
            pos += 2 + size
            (size,) = struct.unpack_from("!H", props, pos)
            found.setdefault(key, props[pos + 2 : pos + 2 + size].decode("utf-8", "replace"))
            pos += 2 + size
        else:
            raise OSError(f"unknown MQTT property 0x{ident:02x}")
    return found

"""The event loop's side of a fleet: each device's connection, from the first CONNECT to the
last DISCONNECT, and the tasks and acks on it.

Why apart from ``control``: everything here runs on the fleet's one event loop thread (the
caller's thread only reads the state under ``_changed``); ``DeviceFleet`` adds what a test calls.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import ssl
import struct
import threading
import time
from typing import Any

from dispatcher.mqtt.client import MqttBroker, mqtt_string
from testkit.fleet.packets import (
    CONNACK,
    DISCONNECT,
    DISCONNECT_PACKET,
    PINGREQ_PACKET,
    PUBACK,
    PUBLISH,
    SUBACK,
    SUBSCRIBE,
    connect,
    packet,
    read_packet,
    read_vbi,
    user_properties,
)
from testkit.fleet.state import (
    CONNECT_ATTEMPTS,
    HANDSHAKE_TIMEOUT,
    MESSAGE_ID,
    OFFLINE,
    ONLINE,
    Device,
    FleetError,
    FleetOptions,
)


class FleetLoop:
    """The devices' connections on one event loop; ``DeviceFleet`` is the face a test uses."""

    def __init__(
        self, broker: MqttBroker, options: FleetOptions, devices: dict[str, Device]
    ) -> None:
        self.options = options
        self.broker = broker
        self._devices = devices
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

    async def _session(self, dev: Device) -> None:
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

    async def _come_up(self, dev: Device) -> asyncio.StreamReader | None:
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

    async def _handshake(self, dev: Device) -> asyncio.StreamReader:
        """CONNECT with the will, SUBSCRIBE to the tasks, publish ``online``: each answered."""
        reader, writer = await asyncio.open_connection(
            sock=await self._connected_socket(),
            ssl=self._ssl,
            server_hostname=self.broker.host if self._ssl else None,
        )
        dev.writer, dev.wanted = writer, True
        self._send(
            dev,
            connect(
                self.options.client_prefix + dev.name,
                keepalive=self.options.keepalive,
                will_topic=self._topic(self.options.status_topic, dev.name),
                will=OFFLINE,
                username=self.broker.username,
                password=self.broker.password,
            ),
        )
        first, body = await read_packet(reader)
        if first >> 4 != CONNACK or len(body) < 2:
            raise FleetError(f"device {dev.name}: expected a CONNACK, got packet type {first >> 4}")
        if body[1] != 0:
            raise FleetError(f"device {dev.name}: the broker refused it (reason 0x{body[1]:02x})")
        pid = dev.pid()
        topic = mqtt_string(self._topic(self.options.topic, dev.name))
        self._send(dev, packet(SUBSCRIBE << 4 | 0x02, struct.pack("!HB", pid, 0) + topic + b"\x01"))
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

    async def _until(self, dev: Device, reader: asyncio.StreamReader, kind: int, pid: int) -> bytes:
        """Handle packets until the answer ``kind`` to packet id ``pid`` arrives; its body."""
        while True:
            first, body = await read_packet(reader)
            if first >> 4 == kind and body[:2] == struct.pack("!H", pid):
                return body
            self._handle(dev, first, body)

    async def _serve(self, dev: Device, reader: asyncio.StreamReader) -> None:
        writer = dev.writer
        assert writer is not None
        try:
            while True:
                first, body = await read_packet(reader)
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

    async def _drop(self, dev: Device) -> None:
        if dev.writer is None:
            raise RuntimeError(f"device {dev.name} is not connected")
        dev.wanted = False
        with self._changed:
            dev.epoch += 1
            dev.in_flight.clear()  # the task it held is lost with it
        self._abort(dev)
        if dev.runner is not None:
            await asyncio.gather(dev.runner, return_exceptions=True)

    async def _reconnect(self, dev: Device, behaviour: str | None) -> None:
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

    def _handle(self, dev: Device, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == PUBLISH:
            self._on_publish(dev, first, body)
        elif kind == DISCONNECT:  # the broker ends the session (a takeover, a shutdown)
            self._abort(dev)
        # PUBACKs of acks, PINGRESPs: nothing to do

    def _on_publish(self, dev: Device, first: int, body: bytes) -> None:
        qos = (first >> 1) & 0x03
        (size,) = struct.unpack_from("!H", body)
        topic = body[2 : 2 + size].decode("utf-8", "replace")
        pos = 2 + size
        if qos:
            self._send(dev, b"\x40\x02" + body[pos : pos + 2])  # PUBACK, reason 0 (short form)
            pos += 2
        length, pos = read_vbi(body, pos)
        user = user_properties(body[pos : pos + length])
        if topic != self._topic(self.options.topic, dev.name):
            return
        task = user.get(MESSAGE_ID)
        if task is None:
            task = body[pos + length :].decode("utf-8", "replace")
        self._on_task(dev, task)

    def _on_task(self, dev: Device, task: str) -> None:
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

    def _ack(self, dev: Device, task: str, epoch: int) -> None:
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

    def _publish(self, dev: Device, template: str, payload: bytes, *, retain: bool = False) -> int:
        """A QoS 1 PUBLISH (no properties) on the device's ``template`` topic; its packet id."""
        pid = dev.pid()
        topic = mqtt_string(self._topic(template, dev.name))
        body = topic + struct.pack("!HB", pid, 0) + payload
        self._send(dev, packet(0x32 | int(retain), body))
        return pid

    def _send(self, dev: Device, data: bytes) -> None:
        writer = dev.writer
        if writer is not None and not writer.is_closing():
            writer.write(data)
            dev.last_sent = asyncio.get_running_loop().time()

    def _abort(self, dev: Device) -> None:
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

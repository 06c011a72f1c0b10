"""``DeviceFleet``: the fleet as a test drives it, from any thread (the devices themselves run on
``FleetLoop``'s event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar, Unpack

from dispatcher.mqtt.client import MqttBroker
from testkit.fleet.loop import FleetLoop
from testkit.fleet.state import (
    BEHAVIOURS,
    Device,
    DeviceRecord,
    FleetError,
    FleetKeywords,
    FleetOptions,
    file_floor,
)

_T = TypeVar("_T")


class DeviceFleet(FleetLoop):
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
        opts = replace(options or FleetOptions(), **keywords)
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
        devices = {name: Device(name, b) for name, b in behaviours.items()}
        super().__init__(MqttBroker.parse(broker_url), opts, devices)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 300) -> DeviceFleet:
        """Bring every device up and return once each is connected, subscribed and has its
        ``online`` acknowledged by the broker (``offline`` devices: once dropped again)."""
        if self._thread is not None:
            raise RuntimeError("the fleet was started already")
        self._fd_floor = file_floor(len(self._devices) + 100)
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

    def _device(self, name: str) -> Device:
        try:
            return self._devices[name]
        except KeyError:
            raise KeyError(f"no device {name!r} in this fleet") from None

    def _call(self, coro: Coroutine[Any, Any, _T]) -> Future[_T]:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the fleet is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

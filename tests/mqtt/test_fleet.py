"""``DeviceFleet`` against a real mosquitto, with a plain paho MQTT 5 client as the gateway: tasks
in, acks out, retained statuses and wills, silent devices and repeated tasks."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from dispatcher.mqtt.client import MqttBroker
from testkit.fleet import MESSAGE_ID, DeviceFleet, FleetOptions

WAIT = 120.0  # generous: these run on a loaded machine; a pass returns as soon as it holds


class Gateway:
    """The gateway's side: publishes tasks and records what arrives on its subscriptions."""

    def __init__(self, url: str, subscriptions: list[str]) -> None:
        broker = MqttBroker.parse(url)
        self.received: dict[str, list[bytes]] = {}  # topic -> payloads, in arrival order
        self._changed = threading.Condition()
        self._granted = threading.Event()
        self._subscriptions = subscriptions
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=f"gateway-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port, keepalive=60)
        self.client.loop_start()
        assert self._granted.wait(WAIT), "the gateway's subscriptions were not granted"

    def _on_connect(self, client: mqtt.Client, *_args: Any) -> None:
        client.subscribe([(topic, 1) for topic in self._subscriptions])

    def _on_subscribe(self, *_args: Any) -> None:
        self._granted.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._changed:
            self.received.setdefault(message.topic, []).append(bytes(message.payload))
            self._changed.notify_all()

    def send(self, device: str, message_id: str | None, payload: bytes = b"task") -> None:
        """One QoS 1 task, its id in the user property (with other properties around it)."""
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ContentType = "application/octet-stream"
        props.CorrelationData = b"\x00\x01corr"
        props.MessageExpiryInterval = 3600
        props.PayloadFormatIndicator = 0
        if message_id is not None:
            props.UserProperty = [("other", "x"), (MESSAGE_ID, message_id)]
        info = self.client.publish(f"devices/{device}/tasks", payload, 1, False, props)
        info.wait_for_publish(WAIT)

    def acks(self, device: str) -> list[str]:
        with self._changed:
            payloads = list(self.received.get(f"devices/{device}/tasks/ack", []))
        return [json.loads(p)["message_id"] for p in payloads]

    def statuses(self, device: str) -> list[bytes]:
        with self._changed:
            return list(self.received.get(f"devices/{device}/status", []))

    def status(self, device: str) -> bytes | None:
        seen = self.statuses(device)
        return seen[-1] if seen else None

    def wait(self, condition: Callable[[], bool]) -> None:
        with self._changed:
            assert self._changed.wait_for(condition, WAIT), "the gateway waited in vain"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def prefix() -> str:
    """Device ids unique to the test: the session's broker keeps earlier tests' statuses."""
    return f"f{uuid.uuid4().hex[:8]}"


@pytest.fixture
def gateway(mqtt_url: str) -> Iterator[Gateway]:
    gw = Gateway(mqtt_url, ["devices/+/tasks/ack", "devices/+/status"])
    yield gw
    gw.close()


def test_two_hundred_devices_each_ack_their_task(
    mqtt_url: str, gateway: Gateway, prefix: str
) -> None:
    devices = [f"{prefix}-{i}" for i in range(200)]
    with DeviceFleet(mqtt_url, dict.fromkeys(devices, "ack")).start(timeout=WAIT) as fleet:
        for d in devices:
            gateway.send(d, f"id-{d}")
        gateway.wait(lambda: all(gateway.acks(d) for d in devices))
        assert all(gateway.acks(d) == [f"id-{d}"] for d in devices)
        assert fleet.wait_for(lambda f: f.acked_count() == 200, WAIT)
        for d in devices:
            record = fleet.record(d)
            assert record.tasks == [f"id-{d}"]
            assert record.acked == [f"id-{d}"]
            assert record.max_in_flight == 1
        assert fleet.done_at(devices, 1) is not None
        assert fleet.done_at(devices, 2) is None
        assert fleet.lost_connections == 0


def test_retained_statuses_follow_wills_drops_and_reconnects(
    mqtt_url: str, gateway: Gateway, prefix: str
) -> None:
    ack, silent, offline = f"{prefix}-a", f"{prefix}-s", f"{prefix}-o"
    behaviours = {ack: "ack", silent: "silent", offline: "offline"}
    with DeviceFleet(mqtt_url, behaviours).start(timeout=WAIT) as fleet:
        late = Gateway(mqtt_url, ["devices/+/status"])  # after start: sees the retained ones
        try:
            late.wait(  # the offline device's will fired
                lambda: (
                    late.status(ack) == b"online"
                    and late.status(silent) == b"online"
                    and late.status(offline) == b"offline"
                )
            )
        finally:
            late.close()
        assert not fleet.record(offline).online

        fleet.go_offline(ack)
        gateway.wait(lambda: gateway.status(ack) == b"offline")
        assert not fleet.record(ack).online
        fleet.reconnect(ack)
        gateway.wait(lambda: gateway.status(ack) == b"online")

        fleet.reconnect(offline)  # comes back acking
        gateway.wait(lambda: gateway.status(offline) == b"online")
        gateway.send(offline, "back")
        gateway.wait(lambda: gateway.acks(offline) == ["back"])
        assert fleet.record(offline).behaviour == "ack"
        assert fleet.lost_connections == 0
    # close() says DISCONNECT: no will fires, the retained statuses stay online.
    after = Gateway(mqtt_url, ["devices/+/status"])
    try:
        after.wait(lambda: all(after.status(d) == b"online" for d in behaviours))
    finally:
        after.close()


def test_a_device_told_offline_again_flaps(mqtt_url: str, gateway: Gateway, prefix: str) -> None:
    device = f"{prefix}-o"
    with DeviceFleet(mqtt_url, {device: "offline"}).start(timeout=WAIT) as fleet:
        fleet.reconnect(device, "offline")  # up, ``online``, and gone again without a DISCONNECT
        flaps = [b"online", b"offline"] * 2
        gateway.wait(lambda: gateway.statuses(device) == flaps)
        assert not fleet.record(device).online


def test_a_silent_device_takes_the_task_and_never_acks(
    mqtt_url: str, gateway: Gateway, prefix: str
) -> None:
    silent = f"{prefix}-s"
    with DeviceFleet(mqtt_url, {silent: "silent"}).start(timeout=WAIT) as fleet:
        gateway.send(silent, "t1")
        assert fleet.wait_for(lambda f: f.record(silent).tasks == ["t1"], WAIT)
        # The fence: an ack would have left before the drop, so before its will reaches us.
        fleet.go_offline(silent)
        gateway.wait(lambda: gateway.status(silent) == b"offline")
        assert gateway.acks(silent) == []
        record = fleet.record(silent)
        assert record.acked == []
        assert record.max_in_flight == 1
        assert fleet.acked_count() == 0


def test_a_repeated_task_is_acked_again_and_counted_as_a_repeat(
    mqtt_url: str, gateway: Gateway, prefix: str
) -> None:
    device = f"{prefix}-a"
    with DeviceFleet(mqtt_url, {device: "ack"}).start(timeout=WAIT) as fleet:
        gateway.send(device, "r1")
        gateway.wait(lambda: gateway.acks(device) == ["r1"])
        gateway.send(device, "r1")
        gateway.wait(lambda: gateway.acks(device) == ["r1", "r1"])
        gateway.send(device, None, payload=b"r2")  # no user property: the payload is the id
        gateway.wait(lambda: gateway.acks(device) == ["r1", "r1", "r2"])
        record = fleet.record(device)
        assert record.tasks == ["r1", "r2"]
        assert record.acked == ["r1", "r1", "r2"]
        assert record.repeats == 1
        assert record.max_in_flight == 1
        assert fleet.acked_count([device]) == 2
        assert fleet.done_at([device], 2) is not None
        assert fleet.done_at([device], 3) is None


def test_ack_delay_holds_the_ack(mqtt_url: str, gateway: Gateway, prefix: str) -> None:
    device = f"{prefix}-a"
    with DeviceFleet(mqtt_url, {device: "ack"}, ack_delay=0.2).start(timeout=WAIT) as fleet:
        gateway.send(device, "slow")
        gateway.wait(lambda: gateway.acks(device) == ["slow"])
        record = fleet.record(device)
        assert record.first_task_at is not None
        assert record.last_ack_at is not None
        assert record.last_ack_at - record.first_task_at >= 0.2


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_idle_devices_ping_and_keep_their_connections(mqtt_url: str, prefix: str) -> None:
    # keepalive 2 s: the broker drops a client silent for 3 s, so 5 s without a loss needs pings.
    options = FleetOptions(keepalive=2)
    behaviours = {f"{prefix}-{i}": "silent" for i in range(5)}
    with DeviceFleet(mqtt_url, behaviours, options).start(timeout=WAIT) as fleet:
        assert not fleet.wait_for(lambda f: f.lost_connections > 0, 5.0)
        assert all(fleet.record(d).online for d in behaviours)


def test_bad_settings_are_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="unknown behaviours"):
        DeviceFleet("mqtt://127.0.0.1:1", {"d": "sleepy"})
    with pytest.raises(ValueError, match="one non-empty topic level"):
        DeviceFleet("mqtt://127.0.0.1:1", {"a/b": "ack"})
    with pytest.raises(ValueError, match=r"\{session\}"):
        DeviceFleet("mqtt://127.0.0.1:1", {"d": "ack"}, FleetOptions(topic="tasks"))

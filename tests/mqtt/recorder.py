"""A subscriber that records what arrives on a topic, and a fence to know it has all of it."""

from __future__ import annotations

import threading
import time
import uuid

from paho.mqtt.client import MQTTMessage

from dispatcher.mqtt.client import MqttBroker, MqttConnection, Publish

FENCE = b"--fence--"


class Recorder:
    """Records the publishes on ``topic`` (a filter: wildcards allowed) in arrival order."""

    def __init__(self, url: str, topic: str) -> None:
        self.topic = topic
        self.messages: list[MQTTMessage] = []
        self._fences: set[bytes] = set()
        self._changed = threading.Condition()
        self.conn = MqttConnection(
            MqttBroker.parse(url), subscriptions=[topic], on_message=self._on_message
        )

    def _on_message(self, message: MQTTMessage) -> None:
        with self._changed:
            if message.payload.startswith(FENCE):
                self._fences.add(bytes(message.payload))
            else:
                self.messages.append(message)
            self._changed.notify_all()

    def fence(self, publisher: MqttConnection, topic: str, timeout: float = 10.0) -> None:
        """Publish a marker on ``topic`` from ``publisher`` and wait until it arrives: MQTT keeps a
        client's QoS 1 publishes to one topic in order, so everything it sent before is here."""
        marker = FENCE + uuid.uuid4().hex.encode()
        deadline = time.monotonic() + timeout
        while True:  # the first fence may race the SUBACK: publish again until one arrives
            publisher.publish([Publish(topic=topic, payload=marker, label="fence")])
            with self._changed:
                if self._changed.wait_for(lambda: marker in self._fences, timeout=0.5):
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the fence on {topic} never arrived")

    def close(self) -> None:
        self.conn.close()

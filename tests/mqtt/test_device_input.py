"""Bad input from devices, through ``outbox run-gateway mqtt`` against a real mosquitto: each gets
one log line and changes nothing. Malformed acks, an ack for a task that is not out, an ack on
another device's topic, an unreadable status, and device ids that cannot be one topic level
(``+``, ``#``, ``/``: dead-lettered ``InvalidDeviceId``, never published)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from dispatcher.mqtt.client import MqttBroker, MqttConnection, Publish
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade

DEST = "devices"


class Lines:
    """A process's stderr, line by line, as it comes (a reader thread)."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, *markers: str, timeout: float = 30.0) -> bool:
        def seen() -> bool:
            return all(any(m in line for line in self.lines) for m in markers)

        with self._changed:
            return self._changed.wait_for(seen, timeout)

    def count(self, marker: str) -> int:
        with self._changed:
            return sum(marker in line for line in self.lines)


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_bad_device_input_gets_one_line_each_and_changes_nothing(
    tmp_path: Path, mqtt_url: str
) -> None:
    sql_url = f"sqlite:///{tmp_path / 'queue.db'}"
    upgrade(sql_url)
    bad_ids = ["x+y", "x#y", "x/y"]
    with SqlQueue(sql_url) as queue:
        queue.send(
            DEST, [QueueMessage(b"{}", message_id=m, session_id="door-a") for m in ("a0", "a1")]
        )
        queue.send(DEST, [QueueMessage(b"{}", message_id="b0", session_id="door-b")])
        queue.send(
            DEST,
            [
                QueueMessage(b"{}", message_id=f"bad{i}", session_id=d)
                for i, d in enumerate(bad_ids)
            ],
        )
    p = f"in{uuid.uuid4().hex[:8]}"
    gateway = subprocess.Popen(
        [
            *(sys.executable, "-m", "outbox.app.cli", "-w", str(tmp_path / "ws")),
            *("run-gateway", "mqtt", "--destination", DEST, "--broker", mqtt_url),
            *("--topic", f"{p}/{{session}}/tasks", "--ack-topic", f"{p}/{{session}}/ack"),
            *("--status-topic", f"{p}/{{session}}/status"),
            *("--retry-interval", "5m", "--poll-interval", "50ms"),
        ],
        env={**os.environ, "OUTBOX_SQL_URL": sql_url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    err = Lines(gateway.stderr)
    device = MqttConnection(MqttBroker.parse(mqtt_url))
    try:
        assert err.wait_for(*(f"dead-lettering bad{i} (InvalidDeviceId)" for i in range(3))), (
            err.lines
        )
        for topic, payload in [
            (f"{p}/door-a/ack", b"{broken"),  # not JSON
            (f"{p}/door-a/ack", b'{"other": 1}'),  # no message id
            (f"{p}/door-a/ack", b'{"message_id": "a1"}'),  # queued, not out
            (f"{p}/door-b/ack", b'{"message_id": "a0"}'),  # door-a's task, on door-b's topic
            (f"{p}/door-a/status", b"maybe"),  # neither online nor offline
        ]:
            device.publish([Publish(topic, payload, label=topic)])
        assert err.wait_for(
            "(not JSON)",
            "(no message id)",
            "ack from device door-a for a1: no such task was delivered to it; ignored",
            "ack from device door-b for a0: no such task was delivered to it; ignored",
            "unreadable status on",
        ), err.lines
        device.publish([Publish(f"{p}/door-b/ack", b'{"message_id": "b0"}', label="b0")])
        with SqlQueue(sql_url) as queue:
            deadline = time.monotonic() + 30
            tick = threading.Event()
            while {m.message_id for m in queue.peek(DEST)} != {"a0", "a1"}:
                assert time.monotonic() < deadline, "the good ack never completed b0"
                tick.wait(0.05)  # the database has nothing to notify: look again shortly
    finally:
        device.close()
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)
    assert gateway.returncode == 0, err.lines[-20:]
    assert not any("Traceback" in line for line in err.lines)
    for marker in [
        "(not JSON)",
        "(no message id)",
        "ack from device door-a for a1",
        "ack from device door-b for a0",
        "unreadable status on",
        *(f"dead-lettering bad{i} (InvalidDeviceId)" for i in range(3)),
    ]:
        assert err.count(marker) == 1, (marker, err.lines)
    with SqlQueue(sql_url) as queue:
        out = {m.message_id: (m.delivery_count, m.state) for m in queue.peek(DEST)}
        dead = {d.session_id: d.reason for d in queue.list_dead_letters(DEST)}
    assert out == {"a0": (1, "locked"), "a1": (0, "active")}, "a0 is still out, a1 still waits"
    assert dead == dict.fromkeys(bad_ids, "InvalidDeviceId")

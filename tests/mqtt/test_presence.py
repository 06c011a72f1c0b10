"""Presence: an offline device's tasks wait, unpublished and untried, for as long as it is away;
and a fleet of devices, each with its own connection and Last Will, served by one gateway
process (``outbox run-gateway mqtt``) while a tenth of them are silent and a tenth offline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from dispatcher.mqtt.client import MqttBroker
from dispatcher.mqtt.gateway import GatewayOptions, MqttGateway
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.testing.devices import DeviceSimulator
from testkit.fleet import DeviceFleet, FleetOptions

DEST = "devices"


@pytest.fixture
def prefix() -> str:
    return f"p{uuid.uuid4().hex[:8]}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    return url


def test_an_offline_device_is_never_tried_nor_dead_lettered_however_long_it_is_away(
    url: str, mqtt_url: str, prefix: str
) -> None:
    """A day by the gateway's clock, with a retry interval of a minute and two tries: the online
    device's tasks are done, the offline one's wait untouched. Without the pause (a receive that
    ignores paused sessions) its tasks go out and are dead-lettered DeviceDidNotAck."""
    clock = ManualClock()
    status = f"{prefix}/{{session}}/status"
    with SqlQueue(url, clock=clock) as queue:
        for dev in ("away", "here"):
            queue.send(DEST, [QueueMessage(b"{}", f"{dev}-t{i}", session_id=dev) for i in range(2)])
        tasks, acks = f"{prefix}/{{session}}/tasks", f"{prefix}/{{session}}/ack"
        with DeviceSimulator(
            mqtt_url, topic=tasks, ack_topic=acks, offline=["away"], status_topic=status
        ) as sim:
            options = GatewayOptions(
                DEST,
                topic=tasks,
                ack_topic=acks,
                status_topic=status,
                retry_interval=60,
                max_tries=2,
            )
            gw = MqttGateway(queue, options, broker=MqttBroker.parse(mqtt_url), clock=clock)
            try:
                gw.learn_presence()
                assert gw.stats.went_offline == 1
                while gw.stats.completed < 2:  # "here" acks by the wall clock, as devices do
                    if not gw.step():
                        assert gw.wait_for_news(10), "no ack from the online device"
                for _ in range(24 * 60):  # then a day, a minute at a time
                    clock.advance(60)
                    gw.step()
            finally:
                gw.close()
        waiting = {m.message_id: m.delivery_count for m in queue.peek(DEST)}
        dead = queue.list_dead_letters(DEST)
    assert sim.record("away").missed == 0, "nothing was published to it"
    assert waiting == {"away-t0": 0, "away-t1": 0}, "its tasks wait, no try used"
    assert dead == []
    assert gw.stats.completed == 2


def _gateway(url: str, mqtt_url: str, ws: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "outbox.app.cli", "-w", str(ws)),
            *("run-gateway", "mqtt", "--destination", DEST, "--broker", mqtt_url),
            *("--topic", "fleet/{session}/tasks", "--ack-topic", "fleet/{session}/ack"),
            *("--status-topic", "fleet/{session}/status", "--ack-group", "fleet"),
            *("--retry-interval", "5m", "--poll-interval", "50ms", "--json"),
        ],
        env={**os.environ, "OUTBOX_SQL_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_one_gateway_process_serves_a_fleet_with_silent_and_offline_devices(
    url: str, mqtt_url: str, tmp_path: Path
) -> None:
    """1,000 devices on a connection each (the benchmark runs 10,000): the acking ones get every
    task in order, one at a time; the silent ones their first task only (a 5-minute retry
    interval), holding up no one; the offline ones (their Last Will fired) nothing. Back online,
    the offline ones get all theirs, in order."""
    n, tasks = 1000, 3
    run = uuid.uuid4().hex[:6]
    names = [f"d{run}-{i:04d}" for i in range(n)]
    mix = {
        d: "silent" if i % 10 == 8 else "offline" if i % 10 == 9 else "ack"
        for i, d in enumerate(names)
    }
    plan = {d: [f"{d}-t{t}" for t in range(tasks)] for d in names}
    with SqlQueue(url) as queue:
        batch = [QueueMessage(b"{}", plan[d][t], session_id=d) for t in range(tasks) for d in names]
        for i in range(0, len(batch), 1000):
            queue.send(DEST, batch[i : i + 1000])
    acking = [d for d, b in mix.items() if b == "ack"]
    offline = [d for d, b in mix.items() if b == "offline"]
    silent = [d for d, b in mix.items() if b == "silent"]
    options = FleetOptions(
        topic="fleet/{session}/tasks",
        ack_topic="fleet/{session}/ack",
        status_topic="fleet/{session}/status",
    )
    with DeviceFleet(mqtt_url, mix, options) as fleet:
        gateway = _gateway(url, mqtt_url, tmp_path / "ws")
        try:
            assert fleet.wait_for(lambda f: f.done_at(acking, tasks) is not None, 120), (
                f"{fleet.acked_count(acking)} of {len(acking) * tasks} acked"
            )
            assert fleet.wait_for(lambda f: all(f.record(d).tasks for d in silent), 60)
            for d in offline:
                fleet.reconnect(d)
            assert fleet.wait_for(lambda f: f.done_at(offline, tasks) is not None, 120)
            assert _left_only(url, set(silent), 60), "the last acks were not all completed"
        finally:
            gateway.send_signal(signal.SIGTERM)
            out, err = gateway.communicate(timeout=60)
        records = {d: fleet.record(d) for d in names}
    assert gateway.returncode == 0, err[-3000:]
    stats = json.loads(out)
    for d in acking + offline:
        assert records[d].tasks == plan[d], d
        assert records[d].max_in_flight == 1, d
    for d in silent:
        assert records[d].tasks == plan[d][:1], "the first task only, sent once"
        assert records[d].repeats == 0
    assert stats["republishes"] == 0
    assert stats["dead_lettered"] == {}
    assert stats["went_offline"] >= len(offline)


def _left_only(url: str, sessions: set[str], timeout: float) -> bool:
    """Wait until the queue holds tasks of ``sessions`` only (the gateway completes the devices'
    last acks a moment after they are sent)."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()  # the database has nothing to notify: look again shortly
    with SqlQueue(url) as queue:
        while {m.session_id for m in queue.peek(DEST, 10_000)} != sessions:
            if time.monotonic() > deadline:
                return False
            tick.wait(0.05)
    return True

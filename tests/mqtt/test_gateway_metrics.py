"""``run-gateway mqtt --metrics-port``: a real gateway process, a real mosquitto and simulated
devices; the scraped ``outbox_gateway_*`` numbers are what the devices saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.testing.devices import DeviceSimulator
from tests.telemetry.scrape import Samples, free_port, probe, scrape, value, wait_for

DEST = "devices"
ACKING = {"dev-a": ["a1", "a2"], "dev-b": ["b1", "b2"]}
MUTE = "dev-mute"  # never acks: its one task stays in flight (published every 2 s)


def test_gateway_serves_its_metrics_and_health(tmp_path: Path, mqtt_url: str) -> None:
    sql_url = f"sqlite:///{tmp_path / 'queue.db'}"
    upgrade(sql_url)
    with SqlQueue(sql_url) as queue:
        for dev, ids in {**ACKING, MUTE: ["m1"]}.items():
            queue.send(DEST, [QueueMessage(b"{}", message_id=m, session_id=dev) for m in ids])
    prefix = f"m{uuid.uuid4().hex[:8]}"
    port = free_port()
    with DeviceSimulator(
        mqtt_url,
        topic=f"{prefix}/{{session}}/tasks",
        ack_topic=f"{prefix}/{{session}}/ack",
        offline=[MUTE],
    ):
        gateway = subprocess.Popen(
            [
                *(sys.executable, "-m", "outbox.app.cli", "-w", str(tmp_path / "ws")),
                *("run-gateway", "mqtt", "--destination", DEST, "--broker", mqtt_url),
                *("--topic", f"{prefix}/{{session}}/tasks"),
                *("--ack-topic", f"{prefix}/{{session}}/ack"),
                *("--retry-interval", "2s", "--max-tries", "1000", "--poll-interval", "50ms"),
                *("--metrics-port", str(port)),
            ],
            env={**os.environ, "OUTBOX_SQL_URL": sql_url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            acked = sum(len(ids) for ids in ACKING.values())

            def done(s: Samples) -> bool:
                # the depth is read from the queue at scrape time, on another connection than
                # the settling one: CI once scraped 3 locked with every ack counted; wait for 1
                return (
                    value(s, "outbox_gateway_tasks_acked_total") >= acked
                    and value(s, "outbox_gateway_devices_in_flight") >= 1
                    and value(s, "outbox_queue_messages", queue=DEST, state="locked") <= 1
                )

            samples = wait_for(gateway, "every ack", lambda: scrape(port), done)
            assert value(samples, "outbox_gateway_tasks_acked_total") == acked
            again = value(samples, "outbox_gateway_tasks_republished_total")  # the mute one's
            assert value(samples, "outbox_gateway_tasks_published_total") == acked + 1 + again
            assert value(samples, "outbox_gateway_devices_in_flight") == 1  # the mute one
            assert value(samples, "outbox_gateway_ack_duration_seconds_count") == acked
            assert value(samples, "outbox_queue_messages", queue=DEST, state="locked") == 1
            assert probe(port, "/healthz") == (200, {"alive": True, "reason": "ticking"})
            assert probe(port, "/readyz") == (
                200,
                {"ready": True, "reason": "queue and broker reachable"},
            )
        finally:
            gateway.send_signal(signal.SIGTERM)
            _out, err = gateway.communicate(timeout=30)
    assert gateway.returncode == 0, err[-3000:]
    assert "Traceback" not in err

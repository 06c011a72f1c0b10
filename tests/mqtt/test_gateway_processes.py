"""The gateway's promise under fire: real ``outbox run-gateway mqtt`` processes, a real mosquitto
restarted mid-run, simulated devices that drop 10% of their acks (and ack twice, and ack ids they
never got), one gateway SIGKILLed mid-run, and devices that never ack.

Checked from the devices' side (the simulator's record), not from the gateway's own story:

* every task of a device that acks is acked, and nothing of it is dead-lettered;
* every task of a device that never acks is dead-lettered ``DeviceDidNotAck``, and only those;
* each device got its tasks in order, and only its own (repeats are re-publishes of the same id);
* **no device ever had more than one task unacked at once**;
* SIGTERM exits 0 and leaves a task still unacked in the queue, its tries stored.

CI runs 50 devices x 5 tasks; ``OUTBOX_GATEWAY_PROOF_DEVICES``/``_TASKS`` scale it up locally.
"""

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
from typing import Any

import pytest

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.testing.devices import DeviceRecord, DeviceSimulator
from tests.mqtt.broker import MosquittoServer

pytestmark = pytest.mark.slow

DEST = "devices"
DEVICES = int(os.environ.get("OUTBOX_GATEWAY_PROOF_DEVICES", "50"))
TASKS = int(os.environ.get("OUTBOX_GATEWAY_PROOF_TASKS", "5"))
SILENT = ("dev3", "dev17")  # these never ack (offline throughout); 2 tasks each
SILENT_TASKS = 2


def _gateway(
    url: str, ws: Path, prefix: str, env: dict[str, str], name: str
) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "outbox.app.cli", "-w", str(ws), "run-gateway", "mqtt",
        "--destination", DEST, "--broker", url,
        "--topic", f"{prefix}/{{session}}/tasks", "--ack-topic", f"{prefix}/{{session}}/ack",
        "--status-topic", f"{prefix}/{{session}}/status",
        "--retry-interval", "250ms", "--max-tries", "6", "--poll-interval", "50ms", "--json",
    ]  # fmt: skip
    # Files, not pipes nobody reads until the end: a gateway logging across the broker's restart
    # must never block on a full pipe (a quiet run once saw the survivor stall there).
    out = (ws.parent / f"{name}.out").open("w")
    err = (ws.parent / f"{name}.err").open("w")
    with out, err:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)


def _drained(queue: SqlQueue, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        stats = queue.stats(DEST).get(DEST)
        if stats is None or stats.total == 0:
            return True
        tick.wait(0.1)  # the database has nothing to notify: look again shortly
    return False


def test_one_task_in_flight_per_device_across_gateways_with_a_crash_and_lost_acks(
    tmp_path: Path, mosquitto: MosquittoServer | str
) -> None:
    if isinstance(mosquitto, str):
        pytest.skip("restarts the broker: needs one the test starts")
    broker = MosquittoServer()  # its own: restarted mid-run
    broker.start()
    try:
        _prove(tmp_path, broker)
    finally:
        broker.cleanup()


def _prove(tmp_path: Path, broker: MosquittoServer) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    sql_url = f"sqlite:///{tmp_path / 'queue.db'}"
    upgrade(sql_url)
    env = {
        **os.environ,
        "OUTBOX_SQL_URL": sql_url,
    }
    plan = {
        f"dev{d}": [f"dev{d}-t{i}" for i in range(SILENT_TASKS if f"dev{d}" in SILENT else TASKS)]
        for d in range(DEVICES)
    }
    with SqlQueue(sql_url) as queue:
        for dev, ids in plan.items():
            queue.send(DEST, [QueueMessage(b"{}", message_id=m, session_id=dev) for m in ids])
        prefix = f"p{uuid.uuid4().hex[:8]}"
        sim = DeviceSimulator(
            broker.url,
            topic=f"{prefix}/{{session}}/tasks",
            ack_topic=f"{prefix}/{{session}}/ack",
            ack_delay=0.05,  # the device works a while: a premature next task overlaps it
            drop_rate=0.1,
            twice_rate=0.05,
            unknown_rate=0.05,
            seed=7,
            offline=SILENT,
        )
        with sim:
            stats = _under_fire(queue, broker, sim, ws=ws, prefix=prefix, env=env)
            records = sim.records()
        in_flight = {d: r.max_in_flight for d, r in records.items() if r.max_in_flight > 1}
        assert in_flight == {}, f"devices with more than one task in flight at once: {in_flight}"
        # left out by the stopped gateway, with its tries: the next gateway takes it from there
        after_sigterm = [(m.message_id, m.delivery_count > 0) for m in queue.peek(DEST)]

        dead = {d.message_id: d.reason for d in queue.list_dead_letters(DEST, limit=100_000)}
    _check_devices(plan, records, dead)
    assert stats["republishes"] > 0, "lost acks were answered by re-publishes"
    assert stats["unknown_acks"] > 0, "double and unknown acks reached the gateway and were ignored"
    assert after_sigterm == [("late", True)]
    assert set(dead) == {m for d in SILENT for m in plan[d]}
    assert sum(len(r.dropped) for r in records.values()) > 0, "the seed drops acks"


def _under_fire(
    queue: SqlQueue,
    broker: MosquittoServer,
    sim: DeviceSimulator,
    *,
    ws: Path,
    prefix: str,
    env: dict[str, str],
) -> dict[str, Any]:
    """Two gateways; one SIGKILLed a third of the way, the broker restarted at two thirds, the
    survivor SIGTERMed while a silent device holds a task. The survivor's stats (JSON)."""
    doomed = _gateway(broker.url, ws, prefix, env, "doomed")
    survivor = _gateway(broker.url, ws, prefix, env, "survivor")
    try:
        third = DEVICES * TASKS // 3  # a third of the tasks out: kill one gateway
        assert sim.wait_for(
            lambda s: sum(len(r.tasks) for r in s.records().values()) >= third, 60
        ), "the gateways never got going"
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        assert sim.wait_for(
            lambda s: sum(len(r.tasks) for r in s.records().values()) >= 2 * third, 60
        ), "the survivor did not go on"
        broker.stop()  # no persistence: subscriptions and queued messages are gone
        broker.start()
        assert _drained(queue, 120), (
            "the surviving gateway did not finish the work; its stderr ends: "
            + (ws.parent / "survivor.err").read_text()[-3000:]
        )
        # SIGTERM while a silent device holds a task: it stays in the queue, tries stored
        queue.send(DEST, [QueueMessage(b"{}", message_id="late", session_id=SILENT[0])])
        missed = sim.record(SILENT[0]).missed
        assert sim.wait_for(lambda s: s.record(SILENT[0]).missed > missed, 30)
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=30)
    finally:
        for p in (doomed, survivor):
            if p.poll() is None:
                p.kill()
                p.wait()
    out, err = ((ws.parent / f"survivor.{k}").read_text() for k in ("out", "err"))
    assert survivor.returncode == 0, err[-3000:]
    stats: dict[str, Any] = json.loads(out)
    return stats


def _check_devices(
    plan: dict[str, list[str]], records: dict[str, DeviceRecord], dead: dict[str, str]
) -> None:
    """Acking devices got every task, in order, and none dead-lettered; silent ones got none,
    and every one of theirs is dead-lettered ``DeviceDidNotAck``."""
    for dev, ids in plan.items():
        rec = records.get(dev)
        if dev in SILENT:
            assert rec is not None
            assert rec.missed >= len(ids)
            assert rec.tasks == []
            assert {m: dead.get(m) for m in ids} == dict.fromkeys(ids, "DeviceDidNotAck")
            continue
        assert rec is not None, f"{dev} never got a task"
        assert rec.tasks == ids, f"{dev}: got {rec.tasks}, in that order"
        assert rec.done >= set(ids), f"{dev}: not every task was acked"
        assert not set(ids) & set(dead), f"{dev} acks, yet {set(ids) & set(dead)} dead-lettered"

"""``outbox demo devices``: door terminals that handle one task at a time, one of them offline.

A few devices get ordered tasks through the SQL queue and ``MqttGateway``, over a throwaway
mosquitto on 127.0.0.1, played by the kit's ``DeviceSimulator``. One device is offline at the
start (its retained status says so, as its Last Will would): nothing is published to it and its
tasks wait in the queue without using up tries while the others finish theirs (``outbox devices
list`` shows it offline), and when it comes back its tasks flow in order. The summary checks, from
the devices' own record, that each got its tasks in order, never two at once, nothing went to the
offline device and nothing was dead-lettered.

Why threads, not processes: the device's wait and catch-up is the story; the multi-process proof
(a gateway SIGKILLed, a broker restart, lost acks) is tests/mqtt/test_gateway_processes.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.app.demos.frame import Step, StoryReport, closing_rows, story_workspace
from outbox.core.errors import MissingDependencyError

if TYPE_CHECKING:
    from dispatcher.queue import SqlQueue
    from outbox.testing.devices import DeviceRecord

DESTINATION = "devices"
OFFLINE = "door-3"
STATUS_TOPIC = "devices/{session}/status"
RETRY_INTERVAL = 0.5  # seconds: short, so the wait shows without taking long
OFFLINE_FOR = 2.0
DEADLINE = 45.0


@dataclass
class DevicesDemoReport(StoryReport):
    devices: int
    tasks_per_device: int
    broker: str = ""
    completed: int = 0
    publishes: int = 0
    republishes: int = 0
    dead_lettered: int = 0
    offline_device: str = OFFLINE
    published_while_offline: int = 0
    queued_behind_while_offline: int = 0
    max_in_flight: int = 0
    devices_in_order: int = 0

    @property
    def ok(self) -> bool:
        """A timed-out wait fails the run too: the devices' record it left unread can hold no
        broken invariant, so held invariants alone would call a stalled run a success."""
        return super().ok and not self.problems


def device_name(i: int) -> str:
    return f"door-{i + 1}"


def run_devices_demo(
    workspace: str | Path | None,
    *,
    devices: int = 4,
    tasks: int = 3,
    broker: str | None = None,
    step: Step,
) -> DevicesDemoReport:
    """Play the story in ``workspace`` (a temporary folder, removed after, if None): queue the
    tasks, serve them with the offline device coming back (``_play``), then sum up."""
    from dispatcher.queue import QueueMessage, SqlQueue
    from migrations.sql import upgrade

    check_needs(broker)
    frame = story_workspace(
        workspace,
        "outbox-devices-demo-",
        DevicesDemoReport,
        devices=devices,
        tasks_per_device=tasks,
    )
    with frame as (ws, report), _broker(broker) as address:
        report.broker = address
        ws.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{ws / 'outbox.db'}"
        upgrade(url)
        names = [device_name(i) for i in range(devices)]
        plan = {d: [f"{d}:task-{t + 1}" for t in range(tasks)] for d in names}
        with SqlQueue(url, lock_duration=10) as queue:
            for d, ids in plan.items():
                queue.send(DESTINATION, [QueueMessage(b'{"open":1}', m, session_id=d) for m in ids])
            step(f"queued {tasks} tasks for each of {devices} devices (a session per device)")
            report.offline_device = OFFLINE if OFFLINE in plan else names[-1]
            records, stats = _play(queue, address, report, plan=plan, step=step)
            report.dead_lettered = len(queue.list_dead_letters(DESTINATION))
        _sum_up(report, plan=plan, records=records, stats=stats, step=step)
    return report


def check_needs(broker: str | None) -> None:
    """What the story needs, checked before anything is queued (a run that fails halfway leaves
    tasks in a kept workspace and says nothing about the rest): paho-mqtt, the ``mqtt`` extra,
    and mosquitto unless ``broker`` names a broker. What is missing is named on one line."""
    from dispatcher.mqtt.client import load_paho
    from outbox.testing.mosquitto import mosquitto_binary

    missing: dict[str, str] = {}
    try:
        load_paho()
    except MissingDependencyError:
        missing["the mqtt extra (paho-mqtt)"] = "pip install 'delta-outbox[mqtt]'"
    if broker is None and mosquitto_binary() is None:
        missing["mosquitto (a local MQTT broker)"] = "scripts/ensure-mosquitto.sh"
    if missing:
        raise MissingDependencyError(
            f"the devices demo needs {' and '.join(missing)}, not installed here; nothing was "
            "queued",
            hint="run ./scripts/demo.sh, which installs what every demo needs (or "
            f"{' and '.join(missing.values())})",
        )


def _play(
    queue: SqlQueue,
    address: str,
    report: DevicesDemoReport,
    *,
    plan: dict[str, list[str]],
    step: Step,
) -> tuple[dict[str, DeviceRecord], Any]:
    """The gateway serves the devices while one is offline, then after it is back; returns each
    device's record and the gateway's stats (None if its run did not end)."""
    from dispatcher.mqtt.client import MqttBroker
    from dispatcher.mqtt.devices import device_statuses
    from dispatcher.mqtt.gateway import GatewayOptions, MqttGateway
    from outbox.testing.devices import DeviceSimulator

    offline, tasks = report.offline_device, report.tasks_per_device
    total = report.devices * tasks
    with DeviceSimulator(
        address, ack_delay=0.05, offline=[offline], status_topic=STATUS_TOPIC
    ) as sim:
        options = GatewayOptions(
            destination=DESTINATION,
            status_topic=STATUS_TOPIC,
            retry_interval=RETRY_INTERVAL,
            poll_interval=0.05,
        )
        gateway = MqttGateway(queue, options, broker=MqttBroker.parse(address))
        stats_box: list[Any] = []
        runner = threading.Thread(
            target=lambda: stats_box.append(gateway.run(handle_signals=False)),
            daemon=True,
        )
        runner.start()
        try:  # however the story ends (Ctrl-C), the gateway stops before its queue closes
            step(
                f"gateway started on {address}; {offline} is offline (its retained status says so)"
            )
            others = total - tasks
            others_done = _wait(lambda: gateway.stats.completed >= others)
            if not others_done:
                report.problems.append("timed out waiting for the online devices")
            (status,) = device_statuses(queue, DESTINATION, device=offline)
            report.published_while_offline = sim.record(offline).missed
            report.queued_behind_while_offline = status.queued + (1 if status.in_flight else 0)
            done = "done" if others_done else "NOT done (timed out)"
            step(
                f"the others are {done}; {offline} is {status.presence}: "
                f"{report.queued_behind_while_offline} tasks wait for it, "
                f"{report.published_while_offline} were published to it"
            )
            sim.online(offline)
            step(f"{offline} is back online")
            if not _wait(lambda: gateway.stats.completed >= total):
                report.problems.append(f"timed out waiting for {offline}")
        finally:
            gateway.stop()
            runner.join(DEADLINE)
            gateway.close()
        return {d: sim.record(d) for d in plan}, stats_box[0] if stats_box else None


def _wait(done: Callable[[], bool]) -> bool:
    """Until ``done()`` (the gateway's counts change on its own thread), at most ``DEADLINE``."""
    tick = threading.Event()  # never set: nothing to be notified by
    deadline = time.monotonic() + DEADLINE
    while not done():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.05)
    return True


def _sum_up(
    report: DevicesDemoReport,
    *,
    plan: dict[str, list[str]],
    records: dict[str, DeviceRecord],
    stats: Any,
    step: Step,
) -> None:
    """The gateway's counts, the devices' record, the closing line and the invariants."""
    if stats is not None:
        report.completed = stats.completed
        report.publishes = stats.publishes
        report.republishes = stats.republishes
    offline, total = report.offline_device, report.devices * report.tasks_per_device
    report.max_in_flight = max(r.max_in_flight for r in records.values())
    report.devices_in_order = sum(records[d].tasks == ids for d, ids in plan.items())
    in_order = "in order" if records[offline].tasks == plan[offline] else "OUT OF ORDER"
    acked = report.completed == total
    step(
        f"{offline}'s tasks went out {in_order}; "
        + (
            "every device acked every task"
            if acked
            else f"{report.completed} of {total} tasks acked and completed"
        )
    )
    report.invariants = {
        "every task acked and completed": report.completed == total,
        "each device got its tasks in order": report.devices_in_order == report.devices,
        "never two tasks in flight on one device": report.max_in_flight == 1,
        "nothing dead-lettered": report.dead_lettered == 0,
        "nothing published to the offline device": report.published_while_offline == 0,
    }


@contextmanager
def _broker(broker: str | None) -> Iterator[str]:
    """``broker``, or when None a throwaway mosquitto on 127.0.0.1, removed afterwards."""
    from outbox.testing.mosquitto import MosquittoServer

    if broker is not None:
        yield broker
        return
    server = MosquittoServer()  # there: ``check_needs`` said so
    try:
        yield server.start()
    finally:
        server.cleanup()


def iter_rows(report: DevicesDemoReport) -> Iterator[tuple[str, str]]:
    """The summary table's rows."""
    yield "devices", f"{report.devices} ({report.tasks_per_device} tasks each)"
    yield "broker", report.broker
    yield "tasks completed", str(report.completed)
    yield "publishes (re-publishes)", f"{report.publishes} ({report.republishes})"
    yield "offline device", report.offline_device
    yield "tasks published to it while offline", str(report.published_while_offline)
    yield "its tasks waiting in the queue meanwhile", str(report.queued_behind_while_offline)
    yield "most tasks in flight on one device", str(report.max_in_flight)
    yield "devices with tasks in order", f"{report.devices_in_order}/{report.devices}"
    yield from closing_rows(report)

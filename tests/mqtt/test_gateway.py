"""The MQTT gateway in one process against a real mosquitto and simulated devices: one task in
flight per device, completion only on the device's ack, re-publish of the same id, dead letters
(DeviceDidNotAck, Expired, NoDevice), silent devices that hold up no one, offline devices, and a
stop that leaves the tasks out to their acks. Bad device input: tests/mqtt/test_presence.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatcher.mqtt.acks import ack_id
from dispatcher.mqtt.client import MqttBroker
from dispatcher.mqtt.gateway import GatewayOptions, GatewayStats, MqttGateway
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.testing.devices import DeviceSimulator
from tests.mqtt.broker import MosquittoServer

DEST = "devices"


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[SqlQueue]:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    q = SqlQueue(url, lock_duration=5, max_delivery_count=10)
    yield q
    q.close()


@pytest.fixture
def prefix() -> str:
    return f"g{uuid.uuid4().hex[:8]}"


#: Seconds a wait on the broker's deliveries may take before it counts as a hang: only a hang
#: reaches it (each wait returns as soon as its condition holds), so a loaded machine costs nothing.
HANG = 60.0


def options(prefix: str, **kw: object) -> GatewayOptions:
    base: dict[str, object] = {
        "destination": DEST,
        "topic": f"{prefix}/{{session}}/tasks",
        "ack_topic": f"{prefix}/{{session}}/ack",
        "status_topic": f"{prefix}/{{session}}/status",
        "retry_interval": 0.3,
        "max_tries": 3,
        "poll_interval": 0.05,
    }
    base.update(kw)
    return GatewayOptions(**base)  # type: ignore[arg-type]


def devices(url: str, prefix: str, **kw: object) -> DeviceSimulator:
    return DeviceSimulator(
        url, topic=f"{prefix}/{{session}}/tasks", ack_topic=f"{prefix}/{{session}}/ack", **kw
    )  # type: ignore[arg-type]


def enqueue(queue: SqlQueue, n_devices: int, n_tasks: int, **kw: object) -> dict[str, list[str]]:
    plan: dict[str, list[str]] = {}
    for d in range(n_devices):
        dev = f"dev{d}"
        ids = [f"{dev}-t{i}" for i in range(n_tasks)]
        queue.send(
            DEST, [QueueMessage(body=b"{}", message_id=m, session_id=dev, **kw) for m in ids]
        )  # type: ignore[arg-type]
        plan[dev] = ids
    return plan


class Running:
    """A gateway serving in a thread until ``finish()``."""

    def __init__(self, gw: MqttGateway) -> None:
        self.gw = gw
        self.stats: GatewayStats | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.stats = self.gw.run(handle_signals=False)

    def finish(self) -> GatewayStats:
        self.gw.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the gateway did not stop"
        self.gw.close()
        assert self.stats is not None
        return self.stats


def pump(gw: MqttGateway, done: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Step ``gw`` on this thread until ``done()``; an idle step waits for the devices' news
    (the gateway's wake-up) briefly; at most ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        if not gw.step():
            gw.wait_for_news(0.05)
    return True


def watch(gw: MqttGateway, done: Callable[[GatewayStats], bool], timeout: float = 20.0) -> bool:
    """Until the stats of ``gw`` (running in its own thread) say ``done``."""
    deadline = time.monotonic() + timeout
    idle = threading.Event()  # never set: the stats change on the gateway's thread
    while not done(gw.stats):
        if time.monotonic() > deadline:
            return False
        idle.wait(0.02)
    return True


def drained(queue: SqlQueue, timeout: float = 20.0) -> bool:
    done = threading.Event()

    def empty() -> bool:
        stats = queue.stats(DEST).get(DEST)
        return stats is None or stats.total == 0

    deadline = datetime.now(UTC) + timedelta(seconds=timeout)
    while datetime.now(UTC) < deadline:
        if empty():
            return True
        done.wait(0.05)  # polling the database: there is nothing to be notified by
    return empty()


def test_each_device_gets_its_tasks_in_order_one_at_a_time(
    sql_url: str, mqtt_url: str, prefix: str
) -> None:
    """On SQLite and on a real PostgreSQL (where receivers skip each other's locked rows)."""
    upgrade(sql_url)
    with SqlQueue(sql_url, lock_duration=5) as queue:
        plan = enqueue(queue, 6, 4)
        with devices(mqtt_url, prefix, ack_delay=0.02) as sim:
            run = Running(MqttGateway(queue, options(prefix), broker=MqttBroker.parse(mqtt_url)))
            assert drained(queue)
            stats = run.finish()
        assert queue.list_dead_letters(DEST) == []
    assert stats.completed == 24
    assert stats.dead_lettered == {}
    for dev, ids in plan.items():
        rec = sim.record(dev)
        assert rec.tasks == ids, "in order"
        assert rec.max_in_flight == 1


def test_a_lost_ack_is_answered_by_a_republish_of_the_same_id(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    plan = enqueue(queue, 4, 3)
    with devices(mqtt_url, prefix, drop_rate=0.3, twice_rate=0.3, unknown_rate=0.3, seed=3) as sim:
        run = Running(
            MqttGateway(queue, options(prefix, max_tries=20), broker=MqttBroker.parse(mqtt_url))
        )
        assert drained(queue)
        stats = run.finish()
    dropped = sum(len(sim.record(d).dropped) for d in plan)
    assert dropped > 0, "the seed drops some acks"
    assert stats.republishes >= dropped
    assert stats.unknown_acks > 0, "twice-acked and unknown ids were ignored"
    assert stats.completed == 12
    for dev, ids in plan.items():
        assert sim.record(dev).tasks == ids
        assert sim.record(dev).max_in_flight == 1


def test_a_device_that_never_acks_gets_its_tasks_dead_lettered_in_order(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    enqueue(queue, 2, 2)
    with devices(mqtt_url, prefix, offline=["dev1"]) as sim:
        run = Running(MqttGateway(queue, options(prefix), broker=MqttBroker.parse(mqtt_url)))
        assert drained(queue)
        stats = run.finish()
    assert sim.record("dev0").tasks == ["dev0-t0", "dev0-t1"]
    assert sim.record("dev1").missed == 6, "3 tries of each of its 2 tasks"
    dead = queue.list_dead_letters(DEST)
    assert [(d.message_id, d.reason) for d in dead] == [
        ("dev1-t0", "DeviceDidNotAck"),
        ("dev1-t1", "DeviceDidNotAck"),
    ]
    assert stats.dead_lettered == {"DeviceDidNotAck": 2}


def test_an_expired_task_is_dead_lettered_and_never_published(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    queue.send(
        DEST,
        [
            QueueMessage(b"{}", message_id="old", session_id="d", headers={"expires_at": past}),
            QueueMessage(b"{}", message_id="new", session_id="d", headers={"expires_at": later}),
            QueueMessage(b"{}", message_id="nodev"),
        ],
    )
    with devices(mqtt_url, prefix) as sim:
        run = Running(MqttGateway(queue, options(prefix), broker=MqttBroker.parse(mqtt_url)))
        assert drained(queue)
        stats = run.finish()
    assert sim.record("d").tasks == ["new"]
    assert {(d.message_id, d.reason) for d in queue.list_dead_letters(DEST)} == {
        ("old", "Expired"),
        ("nodev", "NoDevice"),
    }
    assert stats.completed == 1


def test_silent_devices_hold_up_no_other_device(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    """40 devices that never ack and 20 that do, with a retry interval of a minute: the acking
    devices get all their tasks before any silent device's first retry. A gateway whose waits
    held slots (the old one, 16 slots) served no acking device until a silent one gave up."""
    silent = [f"dev{d}" for d in range(40)]
    plan = enqueue(queue, 60, 3)
    acking = [d for d in plan if d not in silent]
    with devices(mqtt_url, prefix, offline=silent) as sim:  # no status: online, just silent
        gw = MqttGateway(
            queue, options(prefix, retry_interval=60), broker=MqttBroker.parse(mqtt_url)
        )
        run = Running(gw)
        assert watch(gw, lambda st: st.completed == 60, 50)
        stats = run.finish()
    assert stats.republishes == 0, "no silent device was tried twice meanwhile"
    assert stats.completed == 60
    assert all(sim.record(d).missed == 1 for d in silent), "each silent device got its first"
    for dev in acking:
        assert sim.record(dev).tasks == plan[dev]


def test_a_silent_device_holds_up_no_acking_one_when_the_places_are_few(
    tmp_path: Path, mqtt_url: str, prefix: str
) -> None:
    """``--max-in-flight 2``: two silent devices queued before an acking one took both places
    try after try (a lapse freed a place and the receive took the oldest task, the silent
    device's again), and the acking device got its first task after 3.5 s instead of 0.5 s. Now
    a place goes to the task ready first: the acking device's, ready since it was enqueued, is
    published when the silent devices' first tries run out, one retry interval on the gateway's
    clock. The silent devices still get every try and are dead-lettered as before."""
    clock = ManualClock()
    url = f"sqlite:///{tmp_path / 'q.db'}"
    upgrade(url)
    silent = ["silent0", "silent1"]
    with SqlQueue(url, clock=clock, max_delivery_count=10) as queue:
        for dev in [*silent, "acking"]:
            queue.send(DEST, [QueueMessage(b"{}", message_id=f"{dev}-t0", session_id=dev)])
        opts = options(prefix, max_in_flight=2, retry_interval=0.5, max_tries=6)
        with devices(mqtt_url, prefix, offline=silent) as sim:  # no status: online, just silent
            gw = MqttGateway(queue, opts, broker=MqttBroker.parse(mqtt_url), clock=clock)
            try:
                gw.step()
                assert gw.stats.publishes == 2, "the two places: the silent devices' first tries"
                clock.advance(0.5)  # their tries run out: one retry interval
                gw.step()
                assert ("acking", "acking-t0") in gw.places, "published in this step"
                assert sim.wait_for(lambda s: s.record("acking").tasks == ["acking-t0"], HANG)
                assert pump(gw, lambda: gw.stats.completed == 1)
                for _ in range(30):  # the silent devices' tries, one interval apart
                    if len(queue.list_dead_letters(DEST)) == 2:
                        break
                    clock.advance(0.5)
                    gw.step()
                # before the close: a try is published without waiting for its PUBACK, and a
                # close that came first dropped the last one (a CI run saw 5 of 6)
                assert sim.wait_for(lambda s: all(s.record(d).missed == 6 for d in silent), HANG)
            finally:
                gw.close()
        dead = queue.list_dead_letters(DEST)
    assert sorted((d.message_id, d.reason) for d in dead) == [
        ("silent0-t0", "DeviceDidNotAck"),
        ("silent1-t0", "DeviceDidNotAck"),
    ]
    assert sim.record("acking").max_in_flight == 1


def test_a_stopped_gateway_leaves_its_task_out_and_a_new_one_completes_it_on_the_ack(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    """The task's state is in the database: the device's ack completes it in another gateway
    process (here a new gateway on the same database), with no second publish."""
    enqueue(queue, 1, 2)
    broker = MqttBroker.parse(mqtt_url)
    with devices(mqtt_url, prefix, drop_rate=1.0) as sim:  # it does the task; the ack is ours
        first = MqttGateway(queue, options(prefix, retry_interval=60), broker=broker)
        assert pump(first, lambda: first.stats.publishes == 1)
        first.close()
        assert sim.wait_for(lambda s: s.record("dev0").done == {"dev0-t0"}, 10)
        second = MqttGateway(queue, options(prefix, retry_interval=60), broker=broker)
        try:
            second.step()
            assert second.stats.publishes == 0, "the task is still out: its next try is stored"
            second.handle(f"{prefix}/dev0/ack", b'{"message_id": "dev0-t0"}')
            assert pump(second, lambda: second.stats.publishes == 1)
            assert second.stats.completed == 1
            # the device gets the publish a moment after the step: wait for it, not for the
            # gateway's close (the record was read after the close, and lost that race under load)
            assert sim.wait_for(lambda s: len(s.record("dev0").tasks) == 2, 10)
        finally:
            second.close()
    assert sim.record("dev0").tasks == ["dev0-t0", "dev0-t1"]
    assert sim.record("dev0").repeats == 0


def test_ack_ids_are_read_from_json_or_text() -> None:
    assert ack_id(b'{"message_id": "a"}') == "a"
    assert ack_id(b'{"id": "b"}') == "b"
    assert ack_id(b" c \n") == "c"
    assert ack_id(b"{broken") is None
    assert ack_id(b"") is None


def test_a_broker_restart_costs_time_not_order_or_flow_control(
    mosquitto: object, queue: SqlQueue, prefix: str
) -> None:
    """The broker goes away mid-run and comes back on the same port (no persistence: it forgets
    every subscription and queued message). Gateway and devices reconnect and subscribe again;
    publishes that failed are retried, acks that were lost are answered by re-publishes."""
    if isinstance(mosquitto, str):
        pytest.skip("restarts only a broker the tests started")
    own = MosquittoServer()
    own.start()
    try:
        plan = enqueue(queue, 5, 4)
        with devices(own.url, prefix, ack_delay=0.05) as sim:
            gw = MqttGateway(queue, options(prefix, max_tries=50), broker=MqttBroker.parse(own.url))
            run = Running(gw)
            assert sim.wait_for(lambda s: sum(len(r.tasks) for r in s.records().values()) >= 5, 10)
            own.stop()
            own.start()
            assert drained(queue, 30)
            stats = run.finish()
    finally:
        own.cleanup()
    assert stats.completed == 20
    assert stats.dead_lettered == {}
    assert stats.publish_failures + stats.republishes > 0, "the restart hit tasks in flight"
    for dev, ids in plan.items():
        assert sim.record(dev).tasks == ids
        assert sim.record(dev).max_in_flight == 1


def test_an_offline_device_gets_nothing_until_it_is_back_then_its_tasks_in_order(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    status = f"{prefix}/{{session}}/status"
    with devices(mqtt_url, prefix, offline=["dev0"], status_topic=status) as sim:
        gw = MqttGateway(queue, options(prefix), broker=MqttBroker.parse(mqtt_url))
        run = Running(gw)
        assert watch(gw, lambda st: st.went_offline == 1), "the retained status came"
        plan = enqueue(queue, 2, 3)
        assert sim.wait_for(lambda s: len(s.record("dev1").done) == 3, 10), "others go on"
        sim.online("dev0")
        assert drained(queue)
        stats = run.finish()
    rec = sim.record("dev0")
    assert rec.missed == 0, "nothing was published to it while it was offline"
    assert rec.tasks == plan["dev0"]
    assert rec.max_in_flight == 1
    assert stats.completed == 6
    assert stats.dead_lettered == {}


def test_a_device_that_drops_off_holding_a_task_gets_it_again_when_back(
    queue: SqlQueue, mqtt_url: str, prefix: str
) -> None:
    enqueue(queue, 1, 2)
    status = f"{prefix}/{{session}}/status"
    with devices(mqtt_url, prefix, ack_delay=0.5, status_topic=status) as sim:
        gw = MqttGateway(
            queue,
            options(prefix, max_tries=1, retry_interval=10),
            broker=MqttBroker.parse(mqtt_url),
        )
        run = Running(gw)
        assert sim.wait_for(lambda s: s.record("dev0").in_flight == {"dev0-t0"}, 10)
        sim.offline("dev0")  # its scheduled ack is lost with it; its status says offline
        assert watch(gw, lambda st: st.returned == 1)
        sim.online("dev0")
        assert drained(queue)
        stats = run.finish()
    rec = sim.record("dev0")
    assert rec.tasks == ["dev0-t0", "dev0-t1"]
    assert rec.repeats == 1, "the lost task came again, same id"
    assert rec.max_in_flight == 1
    assert stats.completed == 2
    assert stats.dead_lettered == {}, (
        "with max_tries=1: the try it went offline with is not held against it"
    )
    assert stats.went_offline == 1


def test_an_ack_taken_in_while_the_database_fails_is_applied_at_the_next_step(
    queue: SqlQueue, mqtt_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The news from devices is kept until the database has it: an ack whose completion failed
    (the database down for a moment) completes at the next step, not at the next try."""
    from outbox.core.errors import QueueUnavailableError

    enqueue(queue, 1, 1)
    gw = MqttGateway(queue, options(prefix, retry_interval=60), broker=MqttBroker.parse(mqtt_url))
    try:
        assert pump(gw, lambda: gw.stats.publishes == 1)
        real = queue.sessions.complete_delivered
        calls = [0]

        def down_once(dest: str, acks: list[tuple[str, str]]) -> list[tuple[str, str]]:
            calls[0] += 1
            if calls[0] == 1:
                raise QueueUnavailableError("the queue database is unreachable")
            return real(dest, acks)

        monkeypatch.setattr(queue.sessions, "complete_delivered", down_once)
        gw.handle(f"{prefix}/dev0/ack", b'{"message_id": "dev0-t0"}')
        with pytest.raises(QueueUnavailableError):
            gw.step()
        gw.step()
    finally:
        gw.close()
    assert gw.stats.completed == 1
    assert queue.peek(DEST) == []

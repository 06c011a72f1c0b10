"""MQTT gateway benchmark: tasks/s through ``MqttGateway`` to devices that ack at once, the ack
round trip, and the ratio to the queue's own receive+complete rate measured in the same run.

    python -m benchmarks.gateway            # 1,000 devices x 10 tasks
    python -m benchmarks.gateway --quick    # 200 devices x 5 tasks, well under a minute
    python -m benchmarks.gateway --smoke    # 4 devices x 2 tasks, 4 slots

Both runs use SQLite and the gateway talks to a throwaway mosquitto on 127.0.0.1
(outbox.testing.mosquitto), or to the broker at ``--broker URL``, with ``--concurrency`` slots.
The baseline does what the gateway does minus MQTT: a thread receives one session head and
completes it, with 1, 4 and ``--concurrency`` threads (SQLite has one writer, so more threads need
not be faster); the ratio is to the best of the three. The gateway adds a QoS 1 publish (waiting
for the PUBACK) and the device's ack before each completion.

A full run writes ``benchmarks/results/gateway.json``; ``--quick`` and ``--smoke`` write
``gateway.quick.json`` / ``gateway.smoke.json`` into a fresh temporary folder, never into
benchmarks/results/; ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, percentile, save
from dispatcher.mqtt.client import MqttBroker
from dispatcher.mqtt.gateway import GatewayOptions, MqttGateway
from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.testing.devices import DeviceSimulator
from outbox.testing.mosquitto import MosquittoServer

DEST = "devices"
BODY = b'{"task":"open","door":"D-12"}'
#: Both sides wait this long when nothing is ready (the gateway's --poll-interval).
POLL = 0.05


def _fill(queue: SqlQueue, devices: int, tasks: int) -> int:
    batch = [
        QueueMessage(BODY, message_id=f"d{d}-t{t}", session_id=f"d{d}")
        for t in range(tasks)
        for d in range(devices)
    ]
    for i in range(0, len(batch), 500):
        queue.send(DEST, batch[i : i + 500])
    return len(batch)


def _queue_rate(url: str, devices: int, tasks: int, threads: int) -> dict[str, Any]:
    with SqlQueue(url, lock_duration=60, pool_size=threads + 2) as queue:
        n = _fill(queue, devices, tasks)
        done = [0] * threads

        idle = threading.Event()  # never set: waits like the gateway's RunLoop when idle

        def work(i: int) -> None:
            while True:
                got = queue.receive(DEST, 1)
                if not got:
                    if queue.stats(DEST).get(DEST) is None:
                        return
                    idle.wait(POLL)  # every head locked by another thread: poll again soon
                    continue
                queue.complete(got[0])
                done[i] += 1

        started = time.perf_counter()
        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - started
    assert sum(done) == n
    return {"tasks": n, "seconds": round(seconds, 2), "per_s": round(n / seconds, 1)}


def _gateway_rate(url: str, broker: str, devices: int, tasks: int, threads: int) -> dict[str, Any]:
    trips: list[float] = []
    with SqlQueue(url, lock_duration=60, pool_size=threads + 2) as queue:
        n = _fill(queue, devices, tasks)
        options = GatewayOptions(
            destination=DEST, retry_interval=30, concurrency=threads, poll_interval=POLL
        )
        with DeviceSimulator(broker, ack_delay=0) as sim:
            gateway = MqttGateway(
                queue, options, broker=MqttBroker.parse(broker), observe_ack=trips.append
            )
            started = time.perf_counter()
            stats = gateway.run(once=True, handle_signals=False)
            seconds = time.perf_counter() - started
            gateway.close()
            in_flight = sim.max_in_flight()
        left = queue.stats(DEST).get(DEST)
    assert stats.completed == n, (stats, left)
    ms = [t * 1000 for t in trips]
    return {
        "tasks": n,
        "seconds": round(seconds, 2),
        "per_s": round(n / seconds, 1),
        "ack_round_trip_p50_ms": round(percentile(ms, 50), 2),
        "ack_round_trip_p99_ms": round(percentile(ms, 99), 2),
        "republishes": stats.republishes,
        "max_in_flight_per_device": in_flight,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway")
    parser.add_argument("--quick", action="store_true", help="200 devices x 5 tasks")
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None, help="slots (default 32)")
    parser.add_argument(
        "--broker", metavar="URL", help="an MQTT broker to use instead of a throwaway mosquitto"
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    devices = args.devices or (4 if args.smoke else 200 if args.quick else 1000)
    tasks = args.tasks or (2 if args.smoke else 5 if args.quick else 10)
    concurrency = args.concurrency or (4 if args.smoke else 32)
    load = round(os.getloadavg()[0], 2)
    with contextlib.ExitStack() as stack:
        broker = args.broker
        if broker is None:
            server = MosquittoServer()
            if not server.available:
                raise SystemExit("mosquitto is not installed: scripts/ensure-mosquitto.sh")
            server.start()
            stack.callback(server.cleanup)
            broker = server.url
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-bench-"))
        gw_url = f"sqlite:///{Path(tmp) / 'gateway.db'}"
        upgrade(gw_url)
        queue_runs = {}
        for threads in sorted({1, 4, concurrency}):
            url = f"sqlite:///{Path(tmp) / f'base{threads}.db'}"
            upgrade(url)
            queue_runs[str(threads)] = _queue_rate(url, devices, tasks, threads)
        gateway = _gateway_rate(gw_url, broker, devices, tasks, concurrency)
    best = max(queue_runs.values(), key=lambda r: float(r["per_s"]))
    ratio = round(gateway["per_s"] / best["per_s"], 3)
    results = {
        "quick": args.quick,
        "devices": devices,
        "tasks_per_device": tasks,
        "concurrency": concurrency,
        "backend": "sqlite",
        # the machine is shared: its load when the run started says how much to trust the rates
        "load_average_1m_at_start": load,
        "queue_receive_complete_by_threads": queue_runs,
        "queue_receive_complete_best_per_s": best["per_s"],
        "gateway": gateway,
        "gateway_over_queue": ratio,
    }
    for threads, run in queue_runs.items():
        print(f"queue receive+complete  {run['per_s']:>8.1f} tasks/s  ({threads} threads)")
    print(
        f"gateway (MQTT, acks)    {gateway['per_s']:>8.1f} tasks/s  x{ratio} of the queue's best; "
        f"ack round trip p50 {gateway['ack_round_trip_p50_ms']} ms, "
        f"p99 {gateway['ack_round_trip_p99_ms']} ms"
    )
    print(f"wrote {save(args, 'gateway', results)}")


if __name__ == "__main__":
    main()

"""MQTT gateway benchmark: a fleet of devices, each on its own MQTT connection, served by one
gateway process, against the queue's own receive+complete rate on the same database in the same
run; silent and offline devices mixed in; the gateway's memory.

    python -m benchmarks.gateway            # 10,000 devices x 5 tasks
    python -m benchmarks.gateway --quick    # 1,000 devices x 5 tasks
    python -m benchmarks.gateway --smoke    # 10 devices x 2 tasks, the floors once

Devices are ``testkit.fleet.DeviceFleet`` (asyncio, one MQTT 5 connection and Last Will
each) in this process; the gateway is ``MqttGateway`` with its default settings in a process of
its own (``--serve``), so its CPU and memory are its own. It connects, learns the devices'
retained statuses, says ``ready``, and starts serving when told ``go``; a run's time is from
``go`` to the fleet's record of the last ack it waits for. The queue is SQLite, filled before
``go`` round-robin (every device's first task, then every second one), as tasks arrive.

* ``queue``: the floor. The same backlog on the same database, drained by the queue's
  receive+complete: receive as many as the gateway's ``--batch``, complete each. Run before and
  after the gateway runs; the better of the two counts (the machine is shared).
* ``queue_batched``: the gateway's own database work minus MQTT: receive a batch, complete it by
  id in one transaction (``SqlSessions.complete_delivered``), as the gateway completes a step's
  acks; the stricter floor.
* ``all_acking``: every device acks at once. Goal: at least 0.9x the floor's rate.
* ``acking_alone`` and ``with_silent_and_offline``: 80% of the devices ack; in the second run the
  other 20% get tasks too, half of them silent (online, never ack) and half offline (their Last
  Will fired before the run). Goal: the acking devices finish within 1.2x of their time alone.
* ``gateway_memory``: the gateway process's peak RSS (``ru_maxrss``) over the ``all_acking`` run,
  and its RSS when ready (connected, nothing served yet).

A full run writes ``benchmarks/results/gateway.json``; ``--quick`` and ``--smoke`` write
``gateway.quick.json`` / ``gateway.smoke.json`` into a fresh temporary folder, never into
benchmarks/results/; ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save
from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from testkit.fleet import DeviceFleet, FleetOptions

BODY = b'{"task":"open","door":"D-12"}'
GOAL_OVER_QUEUE = 0.9
GOAL_SLOWDOWN = 1.2
BATCH = 500  # the gateway's default --batch: the floor receives as many at a time


def _names(n: int) -> list[str]:
    return [f"dev{d:05d}" for d in range(n)]


def _fill(url: str, dest: str, devices: list[str], tasks: int) -> int:
    batch = [
        QueueMessage(BODY, message_id=f"{dest}-{d}-t{t}", session_id=d)
        for t in range(tasks)
        for d in devices
    ]
    with SqlQueue(url) as queue:
        for i in range(0, len(batch), 1000):
            queue.send(dest, batch[i : i + 1000])
    return len(batch)


def _queue_rate(
    url: str, dest: str, devices: list[str], tasks: int, *, batched: bool = False
) -> dict[str, Any]:
    """Drain the backlog: receive ``BATCH``, complete each (``batched``: all of them in one
    transaction by id, as the gateway completes a step's acks)."""
    n = _fill(url, dest, devices, tasks)
    with SqlQueue(url, lock_duration=60) as queue:
        started = time.perf_counter()
        done = 0
        while done < n:
            got = queue.receive(dest, BATCH)
            if batched:
                acks = [(m.session_id or "", m.message_id) for m in got]
                queue.sessions.complete_delivered(dest, acks)
            else:
                for msg in got:
                    queue.complete(msg)
            done += len(got)
        seconds = time.perf_counter() - started
    return {"tasks": n, "wall_s": round(seconds, 2), "per_s": round(n / seconds, 1)}


# --- the gateway's process --------------------------------------------------------------------


def serve(url: str, dest: str, broker: str) -> None:
    """``--serve``: build the gateway (default settings), say ready, serve from ``go`` on stdin
    until nothing is left (``once``) or SIGTERM, then print its stats, time and memory as JSON."""
    from dispatcher.mqtt.client import MqttBroker
    from dispatcher.mqtt.gateway import GatewayOptions, MqttGateway

    with SqlQueue(url) as queue:
        gateway = MqttGateway(
            queue, GatewayOptions(destination=dest), broker=MqttBroker.parse(broker)
        )
        print(json.dumps({"ready": True, "rss_kb": _rss_kb()}), flush=True)
        once = sys.stdin.readline().strip() == "go once"
        started = time.perf_counter()
        profile = os.environ.get("OUTBOX_BENCH_PROFILE")  # a file for cProfile's stats
        if profile:
            import cProfile

            with cProfile.Profile() as prof:
                stats = gateway.run(once=once)
            prof.dump_stats(profile)
        else:
            stats = gateway.run(once=once)
        seconds = time.perf_counter() - started
        gateway.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"stats": stats.to_dict(), "seconds": seconds, "peak_rss_kb": peak}), flush=True
    )


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def _gateway(url: str, dest: str, broker: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gateway", "--serve", url, dest, "--broker", broker],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the gateway process ended (exit {proc.wait()})")
    data: dict[str, Any] = json.loads(line)
    return data


def _gateway_run(
    url: str,
    dest: str,
    broker: str,
    fleet: DeviceFleet,
    *,
    devices: list[str],
    waited: list[str],
    tasks: int,
    before: int = 0,
) -> dict[str, Any]:
    """Queue ``tasks`` for each of ``devices``, serve them, and time until every one of
    ``waited`` acked all of its tasks (``before``: tasks each acked in earlier runs)."""
    n = _fill(url, dest, devices, tasks)
    with _gateway(url, dest, broker) as proc:
        ready = _read(proc)
        assert proc.stdin is not None
        once = devices == waited  # nobody silent: the gateway ends when the queue is empty
        go = time.monotonic()
        proc.stdin.write("go once\n" if once else "go\n")
        proc.stdin.flush()
        last = before + tasks
        if not fleet.wait_for(lambda f: f.done_at(waited, last) is not None, 600):
            raise RuntimeError(f"the devices did not finish: {fleet.acked_count(waited)} acked")
        end = fleet.done_at(waited, last)
        assert end is not None
        if not once:
            proc.send_signal(signal.SIGTERM)
        report = _read(proc)
        proc.wait(60)
    seconds = end - go
    done = len(waited) * tasks
    return {
        "tasks": n,
        "tasks_waited_for": done,
        "wall_s": round(seconds, 2),
        "per_s": round(done / seconds, 1),
        "ready_rss_mb": round(ready["rss_kb"] / 1024, 1),
        "peak_rss_mb": round(report["peak_rss_kb"] / 1024, 1),
        "stats": report["stats"],
    }


def _mix(devices: list[str]) -> dict[str, str]:
    """80% ack, 10% silent, 10% offline, spread over the ids."""
    return {
        d: "silent" if i % 10 == 8 else "offline" if i % 10 == 9 else "ack"
        for i, d in enumerate(devices)
    }


def run(
    broker: str, devices: int, tasks: int, tmp: Path, *, floors_after: bool = True
) -> dict[str, Any]:
    """The runs; ``floors_after``: the floors again after the gateway's runs (the better of the
    two counts), which a smoke run leaves out: the same steps again, measuring nothing."""
    url = f"sqlite:///{tmp / 'gateway.db'}"
    upgrade(url)
    names = _names(devices)
    floor = [_queue_rate(url, "floor-1", names, tasks)]
    batched = [_queue_rate(url, "batched-1", names, tasks, batched=True)]
    with DeviceFleet(
        broker, dict.fromkeys(names, "ack"), FleetOptions(client_prefix="a-")
    ) as fleet:
        all_acking = _gateway_run(
            url, "all", broker, fleet, devices=names, waited=names, tasks=tasks
        )
        in_flight = fleet.max_in_flight()
    mix = _mix(names)
    acking = [d for d, b in mix.items() if b == "ack"]
    with DeviceFleet(broker, mix, FleetOptions(client_prefix="m-")) as fleet:
        alone = _gateway_run(
            url, "alone", broker, fleet, devices=acking, waited=acking, tasks=tasks
        )
        mixed = _gateway_run(
            url, "mixed", broker, fleet, devices=names, waited=acking, tasks=tasks, before=tasks
        )
        in_flight = max(in_flight, fleet.max_in_flight())
    if floors_after:
        floor.append(_queue_rate(url, "floor-2", names, tasks))
        batched.append(_queue_rate(url, "batched-2", names, tasks, batched=True))
    best = max(floor, key=lambda r: float(r["per_s"]))
    best_batched = max(batched, key=lambda r: float(r["per_s"]))
    return {
        "queue": {"runs": floor, "best_per_s": best["per_s"]},
        "queue_batched": {"runs": batched, "best_per_s": best_batched["per_s"]},
        "all_acking": all_acking,
        "gateway_over_queue": round(all_acking["per_s"] / best["per_s"], 3),
        "gateway_over_queue_batched": round(all_acking["per_s"] / best_batched["per_s"], 3),
        "acking_alone": alone,
        "with_silent_and_offline": mixed,
        "silent_and_offline_slowdown": round(mixed["wall_s"] / alone["wall_s"], 3),
        "gateway_memory_mb": {
            "ready": all_acking["ready_rss_mb"],
            "peak": all_acking["peak_rss_mb"],
        },
        "max_in_flight_per_device": in_flight,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway")
    parser.add_argument("--quick", action="store_true", help="1,000 devices x 5 tasks")
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument(
        "--broker", metavar="URL", help="an MQTT broker to use instead of a throwaway mosquitto"
    )
    parser.add_argument("--serve", nargs=2, metavar=("SQL_URL", "DEST"), help=argparse.SUPPRESS)
    add_output_options(parser)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], args.serve[1], args.broker)
        return
    # --smoke: 10 devices, the fewest with a silent and an offline one in the mix (_mix)
    devices = args.devices or (10 if args.smoke else 1000 if args.quick else 10_000)
    tasks = args.tasks or (2 if args.smoke else 5)
    load = round(os.getloadavg()[0], 2)
    _raise_file_limit()  # mosquitto, started from here, inherits it: a connection per device
    with contextlib.ExitStack() as stack:
        broker = args.broker
        if broker is None:
            from outbox.testing.mosquitto import MosquittoServer

            server = MosquittoServer()
            if not server.available:
                raise SystemExit("mosquitto is not installed: scripts/ensure-mosquitto.sh")
            server.start()
            stack.callback(server.cleanup)
            broker = server.url
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-bench-")))
        measured = run(broker, devices, tasks, tmp, floors_after=not args.smoke)
    results = {
        "quick": args.quick,
        "devices": devices,
        "tasks_per_device": tasks,
        "backend": "sqlite",
        "batch": BATCH,
        "goals": {
            "gateway_over_queue": GOAL_OVER_QUEUE,
            "silent_and_offline_slowdown": GOAL_SLOWDOWN,
        },
        # the machine is shared: its load when the run started says how much to trust the rates
        "load_average_1m_at_start": load,
        **measured,
    }
    q, a = measured["queue"], measured["all_acking"]
    print(f"queue receive+complete  {q['best_per_s']:>9.1f} tasks/s")
    print(
        f"  completed in batches  {measured['queue_batched']['best_per_s']:>9.1f} tasks/s "
        f"(gateway x{measured['gateway_over_queue_batched']})"
    )
    print(
        f"gateway, all acking     {a['per_s']:>9.1f} tasks/s  x{measured['gateway_over_queue']} "
        f"of the queue (goal {GOAL_OVER_QUEUE})"
    )
    print(
        f"acking devices alone {measured['acking_alone']['wall_s']} s, with silent and offline "
        f"ones {measured['with_silent_and_offline']['wall_s']} s: "
        f"x{measured['silent_and_offline_slowdown']} (goal at most {GOAL_SLOWDOWN})"
    )
    print(f"gateway memory: {measured['gateway_memory_mb']} MB")
    print(f"wrote {save(args, 'gateway', results)}")


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    main()

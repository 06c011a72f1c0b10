"""Consumer benchmark (issue 45, P18): how fast ``Consumer`` drains the SQL queue with an empty
handler, against a raw-SQL floor that receives and completes in batches of 100.

    python -m benchmarks.consumer                 # SQLite and PostgreSQL (a throwaway server)
    python -m benchmarks.consumer --quick         # SQLite only, a minute or so
    python -m benchmarks.consumer --smoke --pg-url URL   # a few hundred messages, both databases

What is timed, per database, in alternating rounds (``--rounds``; each figure is the best round,
since someone else's load only ever slows a round down):

* ``consumer_1``, ``consumer_4``, ``consumer_16``: ``Consumer.run_forever`` at that concurrency,
  its other options at their defaults (``consumer_1_receive_100``: one handler, receives of
  100), with a handler that only counts, from the start of the run to its return after the last
  message (the run stops itself there, completing what it handled); the queue was filled
  before, by batch sends. Every message must be handled once and the queue left empty
  (at-least-once, and no duplicate in a clean run).
* ``floor``: the same number of rows, in a table with only a primary key, drained by hand with
  the same durability (``outbox.core.sql.make_engine``: WAL and ``synchronous=FULL`` on SQLite):
  one transaction takes 100 (``UPDATE ... RETURNING``, with ``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL) and one deletes those 100, until none is left. No sessions, no lock tokens, no
  duplicate detection, no handler.
* ``latency``: one message at a time while a consumer runs (``poll_interval`` as recorded):
  send -> handler, and send -> its row gone (completed), p50 and p99.

The goal (issue 45, P18): ``consumer_1`` >= 10,000 msg/s and >= 0.25x the floor, on SQLite and
on PostgreSQL. Client CPU per message (this process) is recorded beside each rate, since wall
time on a shared machine is noisy.

A full run writes ``benchmarks/results/consumer.json``; ``--quick`` and ``--smoke`` write
``consumer.quick.json`` / ``consumer.smoke.json`` into a fresh temporary folder, never into
benchmarks/results/; ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from benchmarks.common import add_output_options, percentile, save
from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.messages import ReceivedMessage
from migrations.sql import upgrade
from outbox.core.sql import make_engine

BODY = b'{"kind":"ShipmentStatusChanged","shipment":"S-000123","status":"delivered"}'
CONCURRENCY = (1, 4, 16)
#: The goal's figures (issue 45, P18).
GOAL_RATE, GOAL_OVER_FLOOR = 10_000.0, 0.25
#: The latency run's idle wait: a consumer polls this often when the queue is empty.
LATENCY_POLL = 0.001


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def _fill(queue: SqlQueue, name: str, n: int) -> None:
    for start in range(0, n, 100):
        queue.send(name, [QueueMessage(BODY) for _ in range(min(100, n - start))])


# --- the consumer --------------------------------------------------------------------------------


def bench_consumer(
    url: str, n: int, concurrency: int, max_messages: int | None = None
) -> dict[str, Any]:
    """``Consumer.run_forever`` draining ``n`` messages at ``concurrency`` (receives of
    ``max_messages``: the consumer's default when None)."""
    _vacuum(url)
    queue = SqlQueue(url, lock_duration=300)
    name = f"c{concurrency}-{max_messages}"
    _fill(queue, name, n)
    handled = itertools.count(1)  # next() is atomic under the GIL: handlers run on threads
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        if next(handled) == n:
            consumer.stop()  # the run completes what it handled, then returns

    consumer = Consumer(
        queue,
        name,
        handler,
        concurrency=concurrency,
        poll_interval=0.01,
        max_messages=max_messages,
    )
    cpu, wall = time.process_time(), time.perf_counter()
    consumer.run_forever()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    got = next(handled) - 1
    left = queue.stats().get(name)
    queue.close()
    if got != n or left is not None:
        raise SystemExit(f"consumer at {concurrency}: handled {got} of {n}, left {left}")
    return {"per_s": _rate(n, wall), "client_cpu_us_per_msg": round(cpu / n * 1e6, 1)}


def _vacuum(url: str) -> None:
    """PostgreSQL: start each case without the dead rows of the cases before it (a completed
    message leaves one until vacuum; benchmarks/sql_queue.py measured what they cost)."""
    engine = make_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE outbox_queue_messages"))
    engine.dispose()


def bench_latency(url: str, samples: int) -> dict[str, Any]:
    """One message at a time: send -> handler and send -> row gone, while a consumer runs."""
    queue = SqlQueue(url, lock_duration=300)
    engine = make_engine(url)
    seen: dict[str, float] = {}
    arrived = threading.Event()

    def handler(m: ReceivedMessage) -> None:
        seen[m.message_id] = time.perf_counter()
        arrived.set()

    consumer = Consumer(queue, "latency", handler, poll_interval=LATENCY_POLL)
    runner = threading.Thread(target=consumer.run_forever, daemon=True)
    runner.start()
    handled_ms: list[float] = []
    gone_ms: list[float] = []
    probe = text("SELECT 1 FROM outbox_queue_messages WHERE queue = 'latency' LIMIT 1")
    try:
        for i in range(samples):
            mid = f"l{i}"
            arrived.clear()
            sent = time.perf_counter()
            queue.send("latency", QueueMessage(BODY, message_id=mid))
            if not arrived.wait(30):
                raise SystemExit(f"latency: message {mid} was not handled within 30 s")
            handled_ms.append((seen[mid] - sent) * 1000)
            while True:  # the row gone: completed
                with engine.connect() as c:
                    if c.execute(probe).first() is None:
                        break
                time.sleep(0.0002)
            gone_ms.append((time.perf_counter() - sent) * 1000)
    finally:
        consumer.stop()
        runner.join(30)
        engine.dispose()
        queue.close()
    return {
        "n": samples,
        "poll_interval_s": LATENCY_POLL,
        "handled_p50_ms": round(percentile(handled_ms, 50), 2),
        "handled_p99_ms": round(percentile(handled_ms, 99), 2),
        "completed_p50_ms": round(percentile(gone_ms, 50), 2),
        "completed_p99_ms": round(percentile(gone_ms, 99), 2),
    }


# --- the floor -----------------------------------------------------------------------------------


def _floor_table(engine: Engine) -> None:
    sqlite = engine.dialect.name == "sqlite"
    pk = "id INTEGER PRIMARY KEY AUTOINCREMENT" if sqlite else "id BIGSERIAL PRIMARY KEY"
    blob = "BLOB" if sqlite else "BYTEA"
    with engine.begin() as c:
        c.execute(text("DROP TABLE IF EXISTS bench_consumer_floor"))
        c.execute(
            text(
                f"CREATE TABLE bench_consumer_floor ({pk}, body {blob} NOT NULL, "
                "taken BOOLEAN NOT NULL DEFAULT FALSE)"
            )
        )


def bench_floor(url: str, n: int) -> dict[str, Any]:
    """Take 100 in one transaction, delete those 100 in another, until the table is empty."""
    engine = make_engine(url)
    _floor_table(engine)
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as c:
        c.execute(text("INSERT INTO bench_consumer_floor (body) VALUES (:b)"), [{"b": BODY}] * n)
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    take = text(
        "UPDATE bench_consumer_floor SET taken = TRUE WHERE id IN (SELECT id FROM "
        f"bench_consumer_floor WHERE NOT taken ORDER BY id LIMIT 100{lock}) RETURNING id, body"
    )
    done = 0
    cpu, wall = time.process_time(), time.perf_counter()
    while True:
        with engine.begin() as c:
            ids = [row[0] for row in c.execute(take)]
        if not ids:
            break
        with engine.begin() as c:
            marks = ", ".join(str(i) for i in ids)  # integers this process just read
            c.execute(text(f"DELETE FROM bench_consumer_floor WHERE id IN ({marks})"))
        done += len(ids)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    engine.dispose()
    if done != n:
        raise SystemExit(f"floor: drained {done} of {n}")
    return {"per_s": _rate(n, wall), "client_cpu_us_per_msg": round(cpu / n * 1e6, 1)}


# --- a run ---------------------------------------------------------------------------------------


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return max(runs, key=lambda r: float(r["per_s"]))


def run_backend(name: str, url: str, n: int, rounds: int, latency: int) -> dict[str, Any]:
    upgrade(url)
    cases: dict[str, Callable[[], dict[str, Any]]] = {"floor": lambda: bench_floor(url, n)}
    for c in CONCURRENCY:
        cases[f"consumer_{c}"] = functools.partial(bench_consumer, url, n, c)
    # one handler, receives of 100 (the floor's batch) instead of the default 16
    cases["consumer_1_receive_100"] = functools.partial(bench_consumer, url, n, 1, 100)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    for _ in range(rounds):  # interleaved: a burst of load skews every case alike
        for key, case in cases.items():
            runs[key].append(case())
    out: dict[str, Any] = {"messages": n, "rounds": rounds}
    out.update({key: _best(got) for key, got in runs.items()})
    out["rounds_per_s"] = {key: [r["per_s"] for r in got] for key, got in runs.items()}
    one, floor = out["consumer_1"]["per_s"], out["floor"]["per_s"]
    out["consumer_1_over_floor"] = round(one / floor, 3) if floor else 0.0
    out["meets_goal"] = one >= GOAL_RATE and out["consumer_1_over_floor"] >= GOAL_OVER_FLOOR
    out["latency"] = bench_latency(url, latency)
    print(f"\n== {name} ({n} messages, best of {rounds})")
    for key in cases:
        r = out[key]
        cpu = r["client_cpu_us_per_msg"]
        print(f"  {key:12s} {r['per_s']:>10,.1f} msg/s   {cpu:>7.1f} us CPU/msg")
    print(f"  consumer_1 / floor  {out['consumer_1_over_floor']}x")
    lat = out["latency"]
    print(
        f"  lone message: handled p50 {lat['handled_p50_ms']} ms p99 {lat['handled_p99_ms']} ms; "
        f"completed p50 {lat['completed_p50_ms']} ms p99 {lat['completed_p99_ms']} ms"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.consumer")
    parser.add_argument("--quick", action="store_true", help="SQLite only, fewer messages")
    parser.add_argument("--messages", type=int, default=None, help="messages per case")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument(
        "--pg-url",
        metavar="URL",
        help="run PostgreSQL on this (empty) database instead of a throwaway server; with "
        "--quick or --smoke too",
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    n = args.messages or (300 if args.smoke else 3000 if args.quick else 20000)
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 3)
    latency = 5 if args.smoke else 50 if args.quick else 200
    results: dict[str, Any] = {
        "quick": args.quick,
        "goal": {"per_s": GOAL_RATE, "over_floor": GOAL_OVER_FLOOR},
        "load_average_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        results["sqlite"] = run_backend("sqlite", url, n, rounds, latency)
    if args.pg_url:
        results["postgresql"] = run_backend("postgresql", args.pg_url, n, rounds, latency)
        results["postgresql_note"] = "the server given by --pg-url"
    elif not args.quick and not args.smoke:
        from tests.pg import PostgresServer

        server = PostgresServer()
        if not server.available:
            print("PostgreSQL is not installed; skipping it")
        else:
            server.start()
            try:
                url = server.create_database("bench")
                results["postgresql"] = run_backend("postgresql", url, n, rounds, latency)
                results["postgresql_note"] = "throwaway server started with fsync=off (tests/pg.py)"
            finally:
                server.cleanup()
    results["load_average_after"] = os.getloadavg()
    print(f"\nwrote {save(args, 'consumer', results)}")


if __name__ == "__main__":
    main()

"""SQL queue benchmark: send, receive+complete and end-to-end latency, against a raw floor.

    python -m benchmarks.sql_queue            # SQLite and PostgreSQL (starts a throwaway server)
    python -m benchmarks.sql_queue --quick    # SQLite only, under a minute

The floor does the same data movement and the same durable work (as many commits) with no queue
semantics: a plain INSERT per message (or one multi-row INSERT per batch) in one transaction; and
for receive+complete, as peek-lock must, one transaction that marks a batch of 10 rows taken
(``UPDATE ... WHERE id IN (SELECT ... LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING``) and then one
committed DELETE per row. The ratio floor/queue is the price of duplicate detection, sessions,
lock tokens and expiry, and indexes.

The machine may be shared: floor and queue run in alternating rounds (``--rounds``, default 3) and
each figure is the best round, so a burst of someone else's load skews both sides alike and is
not taken for the queue's cost; the load average before and after is in the results.
Writes ``benchmarks/results/sql_queue.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from benchmarks.common import percentile, write_results
from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.core.sql import make_engine

BODY = b'{"kind":"ShipmentStatusChanged","shipment":"S-000123","status":"delivered"}'


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# --- the queue -----------------------------------------------------------------------------------


def _drain(queue: SqlQueue, name: str) -> int:
    done = 0
    while True:
        batch = queue.receive(name, 10)
        if not batch:
            return done
        for m in batch:
            queue.complete(m)
        done += len(batch)


def bench_queue(url: str, n: int, *, latency: bool = True) -> dict[str, Any]:
    queue = SqlQueue(url, lock_duration=300)
    out: dict[str, Any] = {}
    single = max(200, n // 5)

    def singles() -> None:
        for _ in range(single):
            queue.send("single", QueueMessage(BODY))

    out["send_single_per_s"] = _rate(single, _timed(singles))
    _drain(queue, "single")

    def batches() -> None:
        for _ in range(n // 100):
            queue.send("batch", [QueueMessage(BODY) for _ in range(100)])

    out["send_batch100_per_s"] = _rate(n // 100 * 100, _timed(batches))
    out["receive_complete_1_per_s"] = _rate(n, _timed(lambda: _check(_drain(queue, "batch"), n)))

    for _ in range(n // 100):
        queue.send("four", [QueueMessage(BODY) for _ in range(100)])
    counts: list[int] = []

    def four() -> None:
        threads = [
            threading.Thread(target=lambda: counts.append(_drain(queue, "four"))) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    out["receive_complete_4_per_s"] = _rate(n, _timed(four))
    _check(sum(counts), n)
    if latency:
        out["latency"] = _latency(queue, min(n // 2, 1000))
    queue.close()
    return out


def _check(got: int, want: int) -> None:
    if got != want:
        raise SystemExit(f"benchmark lost messages: drained {got}, sent {want}")


def _latency(queue: SqlQueue, n: int) -> dict[str, float]:
    """A producer sends one message every ~1 ms; a consumer polls, receives and completes."""
    sent_at: dict[str, float] = {}
    samples: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while len(samples) < n and not stop.is_set():
            for m in queue.receive("latency", 10):
                queue.complete(m)
                samples.append(time.perf_counter() - sent_at[m.message_id])

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(n):
        mid = f"l{i}"
        sent_at[mid] = time.perf_counter()
        queue.send("latency", QueueMessage(BODY, message_id=mid))
        time.sleep(0.001)
    consumer.join(60)
    stop.set()
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
    }


# --- the floor -----------------------------------------------------------------------------------


def _floor_table(engine: Engine) -> None:
    pk = (
        "id INTEGER PRIMARY KEY AUTOINCREMENT"
        if engine.dialect.name == "sqlite"
        else "id BIGSERIAL PRIMARY KEY"
    )
    blob = "BLOB" if engine.dialect.name == "sqlite" else "BYTEA"
    with engine.begin() as c:
        c.execute(text("DROP TABLE IF EXISTS bench_floor"))
        c.execute(
            text(
                f"CREATE TABLE bench_floor ({pk}, body {blob} NOT NULL, "
                "taken BOOLEAN NOT NULL DEFAULT FALSE)"
            )
        )


def bench_floor(url: str, n: int) -> dict[str, Any]:
    engine = make_engine(url)
    _floor_table(engine)
    postgres = engine.dialect.name == "postgresql"
    insert = text("INSERT INTO bench_floor (body) VALUES (:b)")
    lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
    take = text(
        "UPDATE bench_floor SET taken = TRUE WHERE id IN (SELECT id FROM bench_floor "
        f"WHERE NOT taken ORDER BY id LIMIT 10{lock}) RETURNING id, body"
    )
    delete = text("DELETE FROM bench_floor WHERE id = :i")
    # A single statement commits on its own: autocommit on PostgreSQL (no BEGIN/COMMIT trips).
    settle = engine.execution_options(isolation_level="AUTOCOMMIT") if postgres else engine
    single = max(200, n // 5)

    def singles() -> None:
        for _ in range(single):
            with settle.begin() as c:
                c.execute(insert, {"b": BODY})

    def batches() -> None:
        for _ in range(n // 100):
            with engine.begin() as c:
                c.execute(insert, [{"b": BODY}] * 100)

    def drain() -> int:
        done = 0
        while True:
            with engine.begin() as c:
                rows = c.execute(take).all()
            if not rows:
                return done
            for row in rows:
                with settle.begin() as c:
                    c.execute(delete, {"i": row[0]})
            done += len(rows)

    out: dict[str, Any] = {"send_single_per_s": _rate(single, _timed(singles))}
    drain()
    out["send_batch100_per_s"] = _rate(n // 100 * 100, _timed(batches))
    out["receive_complete_1_per_s"] = _rate(n, _timed(lambda: _check(drain(), n)))
    batches()
    counts: list[int] = []

    def four() -> None:
        threads = [threading.Thread(target=lambda: counts.append(drain())) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    out["receive_complete_4_per_s"] = _rate(n, _timed(four))
    _check(sum(counts), n)
    engine.dispose()
    return out


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each rate's best round (noise only ever slows a round down); latency from the last."""
    out: dict[str, Any] = {}
    for key, value in runs[-1].items():
        if isinstance(value, float):
            out[key] = max(r[key] for r in runs)
        else:
            out[key] = value
    return out


# --- driver --------------------------------------------------------------------------------------


def run_backend(name: str, url: str, n: int, rounds: int) -> dict[str, Any]:
    upgrade(url)
    floors, queues = [], []
    for r in range(rounds):
        floors.append(bench_floor(url, n))
        queues.append(bench_queue(url, n, latency=r == rounds - 1))
    floor, queue = _best(floors), _best(queues)
    ratios = {
        k: round(floor[k] / queue[k], 2)
        for k in floor
        if isinstance(queue.get(k), float) and queue[k] > 0
    }
    result = {
        "messages": n,
        "rounds": rounds,
        "queue": queue,
        "floor": floor,
        "floor_over_queue": ratios,
    }
    print(f"\n== {name} ({n} messages)")
    for k in floor:
        print(f"  {k:28s} queue {queue[k]:>9.1f}/s   floor {floor[k]:>9.1f}/s   x{ratios[k]}")
    lat = queue["latency"]
    print(f"  end-to-end latency          p50 {lat['p50_ms']} ms   p99 {lat['p99_ms']} ms")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sql_queue")
    parser.add_argument("--quick", action="store_true", help="SQLite only, fewer messages")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="alternating floor/queue rounds")
    args = parser.parse_args(argv)
    n = args.messages or (2000 if args.quick else 5000)
    rounds = args.rounds or (1 if args.quick else 3)
    results: dict[str, Any] = {"quick": args.quick, "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        results["sqlite"] = run_backend("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", n, rounds)
    if not args.quick:
        from tests.pg import PostgresServer

        server = PostgresServer()
        if not server.available:
            print("PostgreSQL is not installed; skipping it")
        else:
            server.start()
            try:
                results["postgresql"] = run_backend(
                    "postgresql", server.create_database("bench"), n, rounds
                )
                results["postgresql_note"] = "throwaway server started with fsync=off (tests/pg.py)"
            finally:
                server.cleanup()
    results["load_average_after"] = os.getloadavg()
    name = "sql_queue.quick" if args.quick else "sql_queue"
    print(f"\nwrote {write_results(name, results)}")


if __name__ == "__main__":
    main()

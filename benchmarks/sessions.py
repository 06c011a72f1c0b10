"""Session receive benchmark: receive+complete across 10,000 sessions against plain receive+complete
on the same database in the same run, on SQLite and PostgreSQL (issue 34's goal: within 2x).

    python -m benchmarks.sessions            # 10,000 x 5: SQLite, a throwaway PostgreSQL
    python -m benchmarks.sessions --quick    # 2,000 sessions, SQLite only
    python -m benchmarks.sessions --smoke --pg-url URL   # 100 sessions x 2, SQLite and that server

Three cases, each a backlog of ``sessions x tasks`` messages sent round-robin (every session's
first task, then every second one...), as a device fleet's tasks arrive:

* ``plain``: the messages have no session: the floor, the same rows and the same loop;
* ``sessions``: one session per device;
* ``sessions_held``: as ``sessions``, with 10% of the sessions held (their head locked and never
  settled: silent devices waiting for an ack) and 10% paused (offline devices): the gateway's
  usual state, where a receive must pass over the sessions it cannot take.

The loop is the gateway's: receive ``--batch`` messages, complete each, until ``--measure``
messages are done. Cases run in alternating rounds (``--rounds``, default 3) and each figure is
the best round, so a burst of someone else's load skews them alike. Each case of each round has a
queue of its own in one database. The ratio is plain / case: 1.0 means sessions cost nothing.

A full run writes ``benchmarks/results/sessions.json``; ``--quick`` and ``--smoke`` write
``sessions.quick.json`` / ``sessions.smoke.json`` into a fresh temporary folder, never into
benchmarks/results/; ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save
from dispatcher.queue import QueueMessage, SqlQueue
from dispatcher.queue.sessions import StateChange
from migrations.sql import upgrade

BODY = b'{"task":"open","door":"D-12"}'
GOAL = 2.0
CASES = ("plain", "sessions", "sessions_held")


def _fill(queue: SqlQueue, name: str, sessions: int, tasks: int, *, with_sessions: bool) -> None:
    batch = [
        QueueMessage(BODY, message_id=f"d{d}-t{t}", session_id=f"d{d}" if with_sessions else None)
        for t in range(tasks)
        for d in range(sessions)
    ]
    for i in range(0, len(batch), 1000):
        queue.send(name, batch[i : i + 1000])


def _hold(queue: SqlQueue, name: str, sessions: int) -> None:
    """Lock the heads of the first 10% of the sessions (never settled) and pause the last 10%."""
    held = sessions // 10
    got = 0
    while got < held:
        got += len(queue.receive(name, min(500, held - got)))
    paused = [
        StateChange(f"d{d}", paused=True, state="offline") for d in range(sessions - held, sessions)
    ]
    queue.sessions.set_states(name, paused)


def _case(
    url: str, case: str, name: str, *, sessions: int, tasks: int, measure: int, batch: int
) -> float:
    with SqlQueue(url, lock_duration=300, max_delivery_count=100) as queue:
        _fill(queue, name, sessions, tasks, with_sessions=case != "plain")
        if case == "sessions_held":
            _hold(queue, name, sessions)
        done = 0
        started = time.perf_counter()
        while done < measure:
            got = queue.receive(name, min(batch, measure - done))
            if not got:
                raise RuntimeError(f"{case}: the queue ran dry after {done} messages")
            for msg in got:
                queue.complete(msg)
            done += len(got)
        return done / (time.perf_counter() - started)


def run_backend(
    url: str, *, sessions: int, tasks: int, measure: int, batch: int, rounds: int
) -> dict[str, Any]:
    upgrade(url)
    best: dict[str, float] = {}
    for r in range(rounds):
        for case in CASES:
            rate = _case(
                url,
                case,
                f"{case}-{r}-{os.getpid()}",
                sessions=sessions,
                tasks=tasks,
                measure=measure,
                batch=batch,
            )
            best[case] = max(best.get(case, 0.0), rate)
            print(f"  round {r + 1} {case:<14} {rate:>9.1f} msg/s", flush=True)
    ratios = {f"plain_over_{c}": round(best["plain"] / best[c], 3) for c in CASES if c != "plain"}
    return {
        **{f"{c}_per_s": round(v, 1) for c, v in best.items()},
        **ratios,
        "goal_within": GOAL,
        "meets_goal": all(v <= GOAL for v in ratios.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sessions")
    parser.add_argument("--quick", action="store_true", help="2,000 sessions, SQLite only")
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--tasks", type=int, default=None, help="messages per session")
    parser.add_argument("--measure", type=int, default=None, help="messages timed per case")
    parser.add_argument("--batch", type=int, default=100, help="messages per receive")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--pg-url",
        metavar="URL",
        help="run PostgreSQL on this database instead of a throwaway server; with --quick or "
        "--smoke too",
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    sessions = args.sessions or (100 if args.smoke else 2000 if args.quick else 10_000)
    tasks = args.tasks or (2 if args.smoke else 5)
    measure = args.measure or (50 if args.smoke else 4000 if args.quick else 10_000)
    rounds = args.rounds or (1 if args.smoke or args.quick else 3)
    sizes = {
        "sessions": sessions,
        "tasks": tasks,
        "measure": measure,
        "batch": args.batch,
        "rounds": rounds,
    }
    results: dict[str, Any] = {
        **{f"{k}_per_case" if k == "measure" else k: v for k, v in sizes.items()},
        "quick": args.quick,
        "load_average_before": os.getloadavg(),
    }
    run = {k: v for k, v in sizes.items()}
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        print("sqlite")
        results["sqlite"] = run_backend(f"sqlite:///{Path(tmp) / 'sessions.db'}", **run)
    if args.pg_url:
        print("postgresql")
        results["postgresql"] = run_backend(args.pg_url, **run)
        results["postgresql_note"] = "the server given by --pg-url"
    elif not args.quick and not args.smoke:
        from tests.pg import PostgresServer

        server = PostgresServer()
        if not server.available:
            raise SystemExit("PostgreSQL is not installed: scripts/ensure-postgres.sh")
        server.start()
        try:
            print("postgresql")
            results["postgresql"] = run_backend(server.create_database("sessions"), **run)
            results["postgresql_note"] = "throwaway server started with fsync=off (tests/pg.py)"
        finally:
            server.cleanup()
    results["load_average_after"] = os.getloadavg()
    print(f"wrote {save(args, 'sessions', results)}")


if __name__ == "__main__":
    main()

"""Many small writers at once (issue 45, P17): threads each committing one document with one
message per unit of work, commit -> settled, on the embedded default.

    python -m benchmarks.small_writers            # 1, 8 and 64 threads, 3 rounds each
    python -m benchmarks.small_writers --quick    # the same, fewer units per thread
    python -m benchmarks.small_writers --smoke    # 1 and 4 threads, a few units

Each case opens a fresh workspace as an application does (``Outbox.open``: the Delta table, the
SQL transport on SQLite, immediate dispatch, the watermark writer), warms it up, then starts the
threads together; they share ``--units`` units of work (``uow.create(...).send(...)``; one thread
runs an eighth of them, at about 30 a second), and a unit
of work returns once its message was accepted by the queue (immediate dispatch). The time ends
when every thread is done and the watermark writer has written what is left (a stream's last
marks are part of its cost). ``units_per_second`` is the best of the rounds (the median is
there too); beside it, how the work was carried: Delta commits and units per commit (the store's
group commit), dispatch calls and commits per call (``dispatcher/combining.py``), and the caller's
unit-of-work time p50/p99.

Two ways, interleaved per round so one machine load applies to both: ``combined`` (the
runtime's dispatch combiner, as shipped) and ``alone`` (the combiner off: each commit's thread
dispatches its own rows, what came before).

The floor does the same durable work in the fewest steps, on one thread: per batch of as many
units as there are threads, the store's refresh and one deltalake append of that many document
rows (the library's own row builder and append, with their application transactions) and one
SQLite transaction (``synchronous=FULL``, WAL, as the queue's) inserting that many messages into
a plain table. It is what perfect
grouping would cost; ``over_floor`` is the combined run's units/s over the floor's.

A full run writes ``benchmarks/results/small_writers.json``; ``--quick`` and ``--smoke`` write
into a fresh temporary folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, percentile, save

GOAL_UNITS_PER_SECOND = 1000.0
GOAL_THREADS = 64


def run_case(threads: int, units: int, *, combine: bool) -> dict[str, Any]:
    """One round: ``threads`` x ``units`` units of work on a fresh workspace."""
    from outbox import Outbox

    ws = Path(tempfile.mkdtemp(prefix=f"small-{threads}-"))
    gc.collect()
    with Outbox.open(ws, default_destination="q", transport="sql") as ob:
        runtime = ob.runtime
        runtime.combiner.enabled = combine
        with ob.unit_of_work() as uow:  # the table, the queue, the pools
            uow.create("warm-up", type="Order").send("Placed", {"i": 0})
        if runtime.watermarks is not None:
            assert runtime.watermarks.flush(60)
        runtime.metrics.reset()
        store = ob.store
        version0, grouped0, calls0 = store.refresh(), store.group_commits, runtime.combiner.calls
        callers: list[float] = []
        failures: list[BaseException] = []
        go = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            mine = []
            try:
                go.wait()
                for i in range(units):
                    t0 = time.perf_counter()
                    with ob.unit_of_work() as uow:
                        doc = uow.create(f"t{t}-u{i}", type="Order", state={"n": i})
                        doc.send("Placed", {"order": f"t{t}-u{i}"})
                    mine.append(time.perf_counter() - t0)
            except BaseException as e:  # reported below, not lost in a thread
                failures.append(e)
            callers.extend(mine)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        go.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        if runtime.watermarks is not None:
            assert runtime.watermarks.flush(600), runtime.watermarks.last_error
        elapsed = time.perf_counter() - start
        assert not failures, failures[0]
        total = threads * units
        sent = runtime.metrics["messages_sent"]
        assert sent == total, f"{sent} of {total} messages sent"
        assert store.scan_pending().num_rows == 0, "units of work left pending"
        commits = store.refresh() - version0
        calls = runtime.combiner.calls - calls0
        return {
            "units_per_second": round(total / elapsed, 1),
            "units": total,
            "seconds": round(elapsed, 3),
            "delta_commits": commits,
            "grouped_commits": store.group_commits - grouped0,
            "units_per_commit": round(total / max(commits, 1), 2),
            "dispatch_calls": calls,
            "commits_per_dispatch_call": round(total / max(calls, 1), 2),
            "send_calls": runtime.metrics["send_calls"],
            "caller_p50_ms": round(percentile(callers, 50) * 1000, 2),
            "caller_p99_ms": round(percentile(callers, 99) * 1000, 2),
        }


def run_floor(batch: int, units: int) -> dict[str, Any]:
    """The same durable work in batches of ``batch`` units, by hand, on one thread: the
    library's rows and append (``outbox.delta.appends``), and a plain SQLite insert."""
    from outbox.delta.store import DeltaDocumentStore

    root = Path(tempfile.mkdtemp(prefix="small-floor-"))
    uri = str(root / "documents")
    DeltaDocumentStore.create(uri, buckets=16)
    store = DeltaDocumentStore(uri)
    db = sqlite3.connect(root / "queue.db", isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=full")
    db.execute("create table messages (id text primary key, queue text, body text)")
    gc.collect()
    start = time.perf_counter()
    done = n = 0
    while done < units:
        take = min(batch, units - done)
        writes = append_by_hand(store, [f"f{n}-u{i}" for i in range(take)])
        insert_by_hand(db, writes, "id")
        done += take
        n += 1
    elapsed = time.perf_counter() - start
    store.close()
    db.close()
    return {"units_per_second": round(units / elapsed, 1), "batch": batch, "units": units}


def append_by_hand(store: Any, doc_ids: list[str]) -> list[Any]:
    """New documents ``doc_ids``, each with one message, appended as a save does without the
    unit of work: the library's rows and append (``outbox.delta.appends``, with their
    application transactions) after the store's refresh. Returns the writes (their messages)."""
    from outbox.core.model import DocumentRow, OutboxMessage, new_incarnation
    from outbox.delta import appends
    from outbox.delta.group_commit import DocumentWrite

    writes = []
    now = datetime.now(UTC)
    for i, doc_id in enumerate(doc_ids):
        life = new_incarnation()
        message = OutboxMessage(
            seq=1, message_id=f"{life}{1:08x}", destination="q", type="Placed",
            body=f'{{"order":"{doc_id}"}}', created_at=now,
        )  # fmt: skip
        row = DocumentRow(
            id=doc_id, type="Order", version=1, state={"n": i}, last_seq=1, dispatched_seq=0,
            outbox=[message], incarnation=life,
        )  # fmt: skip
        writes.append(DocumentWrite(row=row, expected_version=0, read_at=-1))
    store._update()  # the store's refresh, reopening as it does (a long-lived handle slows)
    appends.append(
        store.delta_table,
        appends.document_rows(writes, store.bucket),
        operation="save",
        documents=[(w.row.id, w.row.version) for w in writes],
    )
    return writes


def insert_by_hand(db: sqlite3.Connection, writes: list[Any], id_column: str) -> None:
    """The messages of ``writes`` (``append_by_hand``'s) inserted into ``db``'s ``messages``
    table (its message id column named ``id_column``) in one transaction: a floor's send."""
    db.execute("begin")
    db.executemany(
        f"insert into messages ({id_column}, queue, body) values (?, ?, ?)",
        [(w.row.outbox[0].message_id, "q", w.row.outbox[0].body) for w in writes],
    )
    db.execute("commit")


def run(thread_counts: list[int], units: int, rounds: int) -> dict[str, Any]:
    """Every thread count, ``rounds`` interleaved rounds of combined and alone, and its floor."""
    cases: dict[str, Any] = {}
    for threads in thread_counts:
        per = max(1, units // max(threads, 8))  # one thread: an eighth (30 units/s)
        sides: dict[str, list[dict[str, Any]]] = {"combined": [], "alone": []}
        floors = []
        for r in range(rounds):
            order = ["combined", "alone"] if r % 2 == 0 else ["alone", "combined"]
            for side in order:
                sides[side].append(run_case(threads, per, combine=side == "combined"))
            floors.append(run_floor(threads, threads * per))
        case: dict[str, Any] = {"threads": threads, "units_per_thread": per}
        for side, runs in sides.items():
            best = max(runs, key=lambda x: x["units_per_second"])
            case[side] = {
                **best,
                "median_units_per_second": round(
                    statistics.median(x["units_per_second"] for x in runs), 1
                ),
                "rounds": [x["units_per_second"] for x in runs],
            }
        floor = max(floors, key=lambda x: x["units_per_second"])
        case["floor"] = floor
        case["combined_over_alone"] = round(
            case["combined"]["units_per_second"] / case["alone"]["units_per_second"], 2
        )
        case["over_floor"] = round(
            case["combined"]["units_per_second"] / floor["units_per_second"], 3
        )
        cases[str(threads)] = case
    top = cases[str(max(thread_counts))]
    return {
        "cases": cases,
        "goal": {"threads": GOAL_THREADS, "units_per_second": GOAL_UNITS_PER_SECOND},
        "headline_threads": max(thread_counts),
        "units_per_second": top["combined"]["units_per_second"],
        "meets_goal": max(thread_counts) >= GOAL_THREADS
        and top["combined"]["units_per_second"] >= GOAL_UNITS_PER_SECOND,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer units per thread")
    parser.add_argument("--threads", type=int, nargs="+", help="thread counts (default 1 8 64)")
    parser.add_argument("--units", type=int, help="units of work per case (split over threads)")
    parser.add_argument("--rounds", type=int, help="rounds per side (default 3)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    threads = args.threads or ([1, 4] if args.smoke else [1, 8, 64])
    units = args.units or (8 if args.smoke else 640 if args.quick else 1920)
    rounds = args.rounds or (1 if args.smoke else 3)
    data = {
        "load_average_before": os.getloadavg(),
        **run(threads, units, rounds),
        "load_average_after": os.getloadavg(),
    }
    path = save(args, "small_writers", data)
    for t, case in data["cases"].items():
        print(
            f"{t} thread(s): {case['combined']['units_per_second']:,.1f} units/s combined, "
            f"{case['alone']['units_per_second']:,.1f} alone, floor "
            f"{case['floor']['units_per_second']:,.1f} ({case['over_floor']}x); "
            f"{case['combined']['units_per_commit']} units per commit, "
            f"{case['combined']['commits_per_dispatch_call']} per dispatch call"
        )
    print(f"-> {path}")


if __name__ == "__main__":
    main()

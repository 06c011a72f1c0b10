"""The whole pipeline on the embedded default against the same work done by hand (issue 45, P2):
a unit of work of 1,000 new documents with one message each, commit -> settled.

    python -m benchmarks.pipeline            # 1,000 documents per unit of work, 10 rounds
    python -m benchmarks.pipeline --quick    # 5 rounds
    python -m benchmarks.pipeline --smoke    # 20 documents, 2 rounds

Two sides, interleaved round by round (the order swapped every other round) so one machine load
applies to both:

* ``outbox``: ``Outbox.open`` as an application opens it (the Delta table, the SQL transport on
  SQLite, immediate dispatch, the watermark writer). A round: one unit of work creating the
  documents, each sending one message (the commit, then the dispatch into the queue); the
  queue's ``Consumer`` (one handler, empty, complete after it) draining them; the watermark
  writer's flush of the round's marks. Settled: every message completed and its mark written.
* ``floor``: what no pipeline can skip, by hand, on one thread: the library's own rows and
  append of the same documents (``outbox.delta.appends``, with their application
  transactions), one SQLite transaction (``synchronous=FULL``, WAL, as the queue's) inserting
  the messages into a plain table, then receive and complete by hand as the consumer floor
  does (take 100 in one transaction, delete them in another, until none is left). No marks: the
  outbox's marks (a second append) are part of what it is measured with, not of the floor.

``over_floor`` is the outbox's messages per second over the floor's, each the median of the
rounds (goal at least 0.5). Where the outbox's round goes is beside it: the unit of work (its
commit and dispatch), the consumer's drain, the marks' flush. A full run writes
``benchmarks/results/pipeline.json``; ``--quick`` and ``--smoke`` write into a fresh temporary
folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save

GOAL = 0.5


def outbox_round(ob: Any, docs: int, r: int) -> dict[str, float]:
    """One round on the open outbox ``ob`` (kept open across rounds, as an application's)."""
    from dispatcher.queue import Consumer, SqlQueue
    from dispatcher.queue.messages import ReceivedMessage

    runtime = ob.runtime
    queue = SqlQueue.from_settings(ob.settings)
    handled = itertools.count(1)
    consumer: Consumer

    def handler(_m: ReceivedMessage) -> None:
        if next(handled) == docs:
            consumer.stop()  # the run completes what it handled, then returns

    consumer = Consumer(queue, "q", handler, poll_interval=0.001)
    gc.collect()
    t0 = time.perf_counter()
    with ob.unit_of_work() as uow:
        for i in range(docs):
            uow.create(f"r{r}-d{i}", type="Order", state={"n": i}).send(
                "Placed", {"order": f"r{r}-d{i}"}
            )
    t1 = time.perf_counter()
    consumer.run_forever()
    t2 = time.perf_counter()
    if runtime.watermarks is not None:
        assert runtime.watermarks.flush(600), runtime.watermarks.last_error
    t3 = time.perf_counter()
    left = queue.stats().get("q")
    queue.close()
    assert left is None, f"{left} left in the queue"
    return {
        "seconds": t3 - t0,
        "unit_of_work_s": t1 - t0,
        "consumer_s": t2 - t1,
        "marks_flush_s": t3 - t2,
    }


def _opened(ws: Path) -> Any:
    """The outbox as an application opens it, warmed (the table, the queue, the pools)."""
    from dispatcher.queue import SqlQueue
    from outbox import Outbox

    ob = Outbox.open(ws, default_destination="q", transport="sql")
    with ob.unit_of_work() as uow:
        uow.create("warm", type="Order").send("Placed", {"i": 0})
    if ob.runtime.watermarks is not None:
        assert ob.runtime.watermarks.flush(60)
    with SqlQueue.from_settings(ob.settings) as queue:
        _drain(queue, 1)
    return ob


def _drain(queue: Any, n: int) -> None:
    got = 0
    while got < n:
        for m in queue.receive("q", 100):
            queue.complete(m)
            got += 1


def floor_round(root: Path, docs: int, r: int) -> dict[str, float]:
    """The same documents and messages by hand (the module docstring)."""
    from benchmarks.small_writers import append_by_hand, insert_by_hand
    from outbox.delta.store import DeltaDocumentStore

    uri = str(root / "documents")
    if not (root / "documents").exists():
        DeltaDocumentStore.create(uri, buckets=16)
    store = DeltaDocumentStore(uri)
    db = sqlite3.connect(root / "queue.db", isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=full")
    db.execute(
        "create table if not exists messages (id integer primary key, message_id text, "
        "queue text, body text, taken boolean not null default false)"
    )
    gc.collect()
    t0 = time.perf_counter()
    writes = append_by_hand(store, [f"r{r}-d{i}" for i in range(docs)])
    insert_by_hand(db, writes, "message_id")
    done = 0
    take = (
        "update messages set taken = true where id in (select id from messages where not taken "
        "order by id limit 100) returning id, body"
    )
    while True:
        db.execute("begin")
        ids = [row[0] for row in db.execute(take)]
        db.execute("commit")
        if not ids:
            break
        db.execute("begin")
        db.execute(f"delete from messages where id in ({', '.join(map(str, ids))})")
        db.execute("commit")
        done += len(ids)
    seconds = time.perf_counter() - t0
    store.close()
    db.close()
    assert done == docs, f"floor drained {done} of {docs}"
    return {"seconds": seconds}


def run(docs: int, rounds: int) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="pipeline-outbox-"))
    root = Path(tempfile.mkdtemp(prefix="pipeline-floor-"))
    sides: dict[str, list[dict[str, float]]] = {"outbox": [], "floor": []}
    ob = _opened(ws)
    try:
        for r in range(rounds):
            order = ["outbox", "floor"] if r % 2 == 0 else ["floor", "outbox"]
            for side in order:
                one = outbox_round(ob, docs, r) if side == "outbox" else floor_round(root, docs, r)
                sides[side].append(one)
        assert ob.store.scan_pending().num_rows == 0, "messages left pending"
    finally:
        ob.close()
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)

    def median(side: str, key: str) -> float:
        return statistics.median(x[key] for x in sides[side])

    out: dict[str, Any] = {"documents_per_unit_of_work": docs, "rounds": rounds}
    for side, done in sides.items():
        out[side] = {
            "messages_per_second": round(docs / median(side, "seconds"), 1),
            "round_ms_p50": round(median(side, "seconds") * 1000, 1),
            "rounds_ms": [round(x["seconds"] * 1000, 1) for x in done],
        }
    out["outbox"]["where_ms_p50"] = {
        k.removesuffix("_s"): round(median("outbox", k) * 1000, 1)
        for k in ("unit_of_work_s", "consumer_s", "marks_flush_s")
    }
    ratio = out["outbox"]["messages_per_second"] / out["floor"]["messages_per_second"]
    out["over_floor"] = round(ratio, 3)
    out["goal_over_floor"] = GOAL
    out["meets_goal"] = ratio >= GOAL
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--docs", type=int, help="documents per unit of work (default 1,000)")
    parser.add_argument("--rounds", type=int)
    add_output_options(parser)
    args = parser.parse_args(argv)
    docs = args.docs or (20 if args.smoke else 1000)
    rounds = args.rounds or (2 if args.smoke else 5 if args.quick else 10)
    data = run(docs, rounds)
    path = save(args, "pipeline", data)
    o, f = data["outbox"], data["floor"]
    print(f"outbox {o['messages_per_second']:,} msg/s ({o['where_ms_p50']}), floor "
          f"{f['messages_per_second']:,} msg/s: {data['over_floor']}x -> {path}")  # fmt: skip


if __name__ == "__main__":
    main()

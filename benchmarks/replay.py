"""Replay benchmark: ``outbox replay``'s send rate against the dispatcher's own, same transport,
same run.

    python -m benchmarks.replay                   # 1,000,000 messages (the issue's size; long)
    python -m benchmarks.replay --quick           # 20,000 messages
    python -m benchmarks.replay --smoke           # 200 messages, every step once

One workspace on the embedded default (the SQL queue on SQLite, the SQL transport): documents are
written with ``--per-doc`` messages each, ``--per-commit`` documents a commit, and dispatched
immediately as each unit of work commits (the default). Then, in this order:

1. **dispatcher**: the floor is the dispatcher's own rate on that transport while the documents
   are written: messages / (the callers' dispatch time summed over the commits, plus the final
   flush of the watermarks still waiting), as ``benchmarks.dispatch`` measures it. The commits'
   own cost is not in it.
2. **replay**: the same versions replayed with new ids (with their own ids the queue would drop
   every one as a repeat of step 1's): planned and enqueued (``Replays.start`` + ``enqueue``,
   timed apart), then a ``DispatcherWorker`` (``--batch-size`` commands a receive, as
   ``outbox run-dispatcher``) sends the chunks (one change-feed read for the chunks received
   together, their messages in shared sends of up to ``max_batch_messages``, the chunks each send
   finished recorded and completed in one write). The replay's rate is messages sent / the
   worker's wall time; the rate with planning included is reported too.

The issue's goal is a replay rate of at least 0.8x the dispatcher's at 1,000,000 messages
(``replay_over_dispatcher``; ``meets_goal``). A full run writes ``benchmarks/results/replay.json``;
``--quick`` and ``--smoke`` write into a fresh temporary folder (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save

GOAL = 0.8


def write(ob: Any, messages: int, per_doc: int, per_commit: int) -> tuple[int, int, int]:
    """Documents of ``per_doc`` messages each, ``per_commit`` documents a commit; returns (the
    first and the last version written, the messages written)."""
    docs = max(1, messages // per_doc)
    first = last = -1
    written = 0
    for start in range(0, docs, per_commit):
        with ob.unit_of_work() as uow:
            for i in range(start, min(docs, start + per_commit)):
                doc = uow.create(f"doc-{i:08d}", type="Package")
                for k in range(per_doc):
                    doc.send("StatusChanged", {"doc": i, "k": k, "status": "in transit"})
                    written += 1
        last = ob.store.refresh()
        first = last if first < 0 else first
    return first, last, written


def run(messages: int, per_doc: int, per_commit: int, batch_size: int) -> dict[str, Any]:
    from dispatcher.worker import DispatcherWorker
    from outbox import Outbox
    from outbox.app.replay import ReplayRequest, Replays
    from outbox.app.replay_plan import CHUNK_MESSAGES

    with tempfile.TemporaryDirectory(prefix="outbox-bench-replay-") as tmp:
        ws = Path(tmp) / "ws"
        with Outbox.open(
            ws,
            transport="sql",
            default_destination="shipments",
            log_retention=7 * 24 * 3600,  # the range must outlive the run
        ) as ob:
            runtime = ob.runtime
            with ob.unit_of_work() as uow:  # warm up: table, queue, connection pool, threads
                uow.create("warm-up", type="Package").send("Created", {"i": 0})
            if runtime.watermarks is not None:
                assert runtime.watermarks.flush(60)
            runtime.metrics.reset()
            t = time.perf_counter()
            first, last, written = write(ob, messages, per_doc, per_commit)
            flush_s = 0.0
            if runtime.watermarks is not None:  # what is still waiting: part of the cost
                t0 = time.perf_counter()
                assert runtime.watermarks.flush(600), runtime.watermarks.last_error
                flush_s = time.perf_counter() - t0
            write_s = time.perf_counter() - t
            m = runtime.metrics
            assert m["messages_sent"] == written, m.snapshot()
            assert ob.store.scan_pending().num_rows == 0, "dispatch left documents pending"
            dispatch_s = sum(m.dispatch_latency) + flush_s

            replays = Replays(
                ob.settings,
                ob.store,
                ob.runtime.queue.database,
                ob.runtime.commands,
                ob.clock,
                chunk_messages=CHUNK_MESSAGES,
            )
            t = time.perf_counter()
            planned = replays.start(ReplayRequest(str(first), str(last), new_ids=True))
            plan_s = time.perf_counter() - t
            t = time.perf_counter()
            replays.enqueue(planned)
            enqueue_s = time.perf_counter() - t
            worker = DispatcherWorker(ob.runtime, batch_size=batch_size, poll_interval=0.01)
            t = time.perf_counter()
            replayed = worker.run(until_idle=True)
            replay_s = time.perf_counter() - t
            status = replays.status(planned.replay_id)
    dispatch_rate = written / dispatch_s
    replay_rate = replayed.messages_sent / replay_s
    with_planning = replayed.messages_sent / (plan_s + enqueue_s + replay_s)
    return {
        "messages": written,
        "write_s": round(write_s, 3),
        "dispatcher": {
            "mode": "immediate",
            "messages_sent": written,
            "seconds": round(dispatch_s, 3),
            "final_flush_s": round(flush_s, 3),
            "messages_per_second": round(dispatch_rate, 1),
        },
        "replay": {
            "messages_sent": replayed.messages_sent,
            "chunks": status.chunks,
            "status": status.status,
            "plan_s": round(plan_s, 3),
            "enqueue_s": round(enqueue_s, 3),
            "send_s": round(replay_s, 3),
            "messages_per_second": round(replay_rate, 1),
            "messages_per_second_with_planning": round(with_planning, 1),
        },
        "replay_over_dispatcher": round(replay_rate / dispatch_rate, 3),
        "replay_with_planning_over_dispatcher": round(with_planning / dispatch_rate, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay")
    parser.add_argument("--quick", action="store_true", help="20,000 messages")
    parser.add_argument("--messages", type=int, default=None, help="messages to write")
    parser.add_argument("--per-doc", type=int, default=4, help="messages per document")
    parser.add_argument("--per-commit", type=int, default=500, help="documents per commit")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="commands a worker receives at once"
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    n = args.messages or (200 if args.smoke else 20_000 if args.quick else 1_000_000)
    per_commit = min(args.per_commit, 25) if args.smoke else args.per_commit
    load_before = os.getloadavg()
    result = run(n, args.per_doc, per_commit, args.batch_size)
    result.update(
        {
            "quick": args.quick,
            "per_doc": args.per_doc,
            "per_commit": per_commit,
            "batch_size": args.batch_size,
            "goal": GOAL,
            "meets_goal": result["replay_over_dispatcher"] >= GOAL,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        }
    )
    path = save(args, "replay", result)
    print(
        f"replay: {result['messages']} messages; dispatcher "
        f"{result['dispatcher']['messages_per_second']}/s, replay "
        f"{result['replay']['messages_per_second']}/s "
        f"({result['replay_over_dispatcher']}x; with planning "
        f"{result['replay_with_planning_over_dispatcher']}x) -> {path}"
    )


if __name__ == "__main__":
    main()

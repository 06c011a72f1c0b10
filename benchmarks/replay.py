"""Replay benchmark: ``outbox replay``'s send rate against the dispatcher's own, same transport,
same run.

    python -m benchmarks.replay                   # 1,000,000 messages (the issue's size; long)
    python -m benchmarks.replay --quick           # 20,000 messages
    python -m benchmarks.replay --smoke           # 200 messages, every step once

One workspace on the embedded default (the SQL queue on SQLite, the SQL transport): documents are
written with deferred dispatch (``--per-doc`` messages each, ``--per-commit`` documents a
commit), so every document has a ``ProcessDocument`` command waiting. Then, in this order:

1. **dispatcher**: a ``DispatcherWorker`` (``--batch-size`` commands a receive, as
   ``outbox run-dispatcher``) sends every message: read the documents, send, one watermark
   commit per batch, settle. Its rate is messages sent / wall time.
2. **replay**: the same versions replayed with new ids (with their own ids the queue would drop
   every one as a repeat of step 1's): planned and enqueued (``Replays.start`` + ``enqueue``,
   timed apart), then the same worker sends the chunks (read the chunk's versions from the change
   data feed, send). The replay's rate is messages sent / the workers' wall time; the rate with
   planning included is reported too.

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
            dispatch="deferred",
            default_destination="shipments",
            log_retention=7 * 24 * 3600,  # the range must outlive the run
        ) as ob:
            t = time.perf_counter()
            first, last, written = write(ob, messages, per_doc, per_commit)
            write_s = time.perf_counter() - t
            worker = DispatcherWorker(ob.runtime, batch_size=batch_size, poll_interval=0.01)
            t = time.perf_counter()
            dispatched = worker.run(until_idle=True)
            dispatch_s = time.perf_counter() - t

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
    dispatch_rate = dispatched.messages_sent / dispatch_s
    replay_rate = replayed.messages_sent / replay_s
    with_planning = replayed.messages_sent / (plan_s + enqueue_s + replay_s)
    return {
        "messages": written,
        "write_s": round(write_s, 3),
        "dispatcher": {
            "messages_sent": dispatched.messages_sent,
            "seconds": round(dispatch_s, 3),
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

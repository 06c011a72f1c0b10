"""``outbox trace`` on a table with a long history (issue 46, item 1's goal: within 200 ms p95
at 1,000,000 documents and 10,000 commits).

    python -m benchmarks.trace_history            # 1,000,000 documents, 10,000 commits
    python -m benchmarks.trace_history --quick    # 10,000 documents, 1,000 commits
    python -m benchmarks.trace_history --smoke    # 1,000 documents, 50 commits

The table is built as ``outbox maintain`` leaves it (``benchmarks.doc_table_outbox.build``),
then ``--commits`` units of work through ``Outbox.open`` (immediate dispatch to the in-memory
transport, the writers' upkeep every ``compact_every`` commits: fold, compaction, log trim with
the default retention), each changing one document with one message: the traced document
every ``--every``-th commit, others the rest. Then ``trace()`` of that document, as the CLI and
the console call it, timed ``--repeat`` times after one warm-up. First the commit index is
caught up over the whole retained history (timed: what the first trace after a long time without
one pays). The floor is the trace's own reads called directly (the table's snapshot and the
document's current row, its rows in the index, those commits' log entries); beside it, the read
a trace without the index cannot skip (the document's change data feed over the retained
history, ``load_cdf`` with its bucket and id). The three are timed in turn.

``--keep DIR`` builds the table in DIR and keeps it, and a later run with the same DIR measures
it again (the build is a quarter of an hour). A full run writes
``benchmarks/results/trace_history.json``; ``--quick`` and ``--smoke`` write
into a fresh temporary folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, percentile, save, summarize_ms

GOAL_MS = 200.0
TRACED = "doc-000000007"


def build(root: Path, documents: int, commits: int, every: int) -> tuple[Any, int, float]:
    """The table, its history; returns (settings, versions of the traced document, seconds)."""
    from benchmarks.doc_table_outbox import build as build_table
    from outbox import Outbox

    settings = build_table(root, documents)
    rng = random.Random(3)
    traced = 0
    started = time.perf_counter()
    with Outbox.open(root, transport="memory", default_destination="orders") as ob:
        for k in range(commits):
            doc_id = TRACED if k % every == 0 else f"doc-{rng.randrange(documents):09d}"
            with ob.unit_of_work() as uow:
                doc = uow.get(doc_id)
                assert doc is not None
                doc.state["n"] = k
                doc.send("Changed", {"k": k})
            traced += doc_id == TRACED
    return settings, traced, time.perf_counter() - started


def _built(root: Path, documents: int, commits: int, every: int) -> tuple[Any, int, float, bool]:
    """``build``, or the table a ``--keep`` run built in ``root`` with the same sizes (the last
    item: whether it was built now)."""
    from outbox import Outbox

    marker = root / "built.json"
    shape = {"documents": documents, "commits": commits, "every": every}
    if marker.exists():
        kept = json.loads(marker.read_text())
        if {k: kept[k] for k in shape} != shape:
            raise SystemExit(f"{root} holds a table of {kept}, not {shape}: give another --keep")
        with Outbox.open(root, create=False, transport="memory") as ob:
            return ob.settings, int(kept["traced"]), float(kept["build_s"]), False
    settings, traced, build_s = build(root, documents, commits, every)
    marker.write_text(json.dumps({**shape, "traced": traced, "build_s": build_s}))
    return settings, traced, build_s, True


def _floor(settings: Any, index: Any, first: int, latest: int) -> int:
    """The trace's own reads called directly: the table's snapshot and the document's current
    row, its rows in the index, those commits' log entries (no catch-up, no fates, no
    formatting)."""
    from outbox.app.trace.changes import Commits
    from outbox.app.trace.timeline import _current
    from outbox.delta.store import DeltaDocumentStore

    opened = DeltaDocumentStore(settings.table_uri)
    try:
        opened.refresh()
        _current(opened, [TRACED])
    finally:
        opened.close()
    rows = index.rows(TRACED, first, latest)
    Commits(settings).load({r["_commit_version"] for r in rows})
    return len(rows)


def measure(settings: Any, repeat: int) -> dict[str, Any]:
    import pyarrow as pa

    from outbox.app.trace import trace
    from outbox.app.trace.changes import Commits
    from outbox.app.trace.index import CommitIndex
    from outbox.core.clock import SystemClock, utc
    from outbox.delta.log import list_log, oldest_commit
    from outbox.delta.reads import quote_ids
    from outbox.delta.store import DeltaDocumentStore
    from outbox.wiring import Backends

    clock = SystemClock()
    store = DeltaDocumentStore(settings.table_uri)
    latest = store.refresh()
    oldest = oldest_commit(list_log(settings.table_uri)) or 0
    backends = Backends(settings, clock=clock)
    index = CommitIndex(backends.sql_queue.database, store.table_id)
    index.clear()  # a kept table's index too: the catch-up timed is always the whole history
    t0 = time.perf_counter()
    indexed = index.catch_up(Commits(settings), oldest, latest, utc(clock.now()))
    catch_up_s = time.perf_counter() - t0
    first = trace(settings, clock, TRACED).documents[0].history_from  # warm-up, and its range
    predicate = f"bucket = {store.bucket(TRACED)} AND id = {quote_ids([TRACED])}"

    def floor() -> int:
        return _floor(settings, index, first, latest)

    def feed() -> int:
        """The read a trace without the index cannot skip: the document's change data feed
        over the retained history."""
        reader = store.delta_table.load_cdf(
            starting_version=first, ending_version=latest, predicate=predicate,
            columns=["id", "version", "_change_type", "_commit_version"],
        )  # fmt: skip
        return int(pa.RecordBatchReader.from_stream(reader).read_all().num_rows)

    traced_s, floor_s, feed_s = [], [], []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = trace(settings, clock, TRACED)
        traced_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        floor()
        floor_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        feed()
        feed_s.append(time.perf_counter() - t0)
    store.close()
    backends.close()
    assert result is not None
    [doc] = result.documents
    stats = {
        **summarize_ms(traced_s),
        "p95_ms": round(percentile([x * 1000 for x in traced_s], 95), 3),
        "max_ms": round(max(traced_s) * 1000, 3),
    }
    return {
        "trace": stats,
        "floor": summarize_ms(floor_s),
        "feed_read": summarize_ms(feed_s),
        "index_catch_up": {
            "commits": indexed,
            "seconds": round(catch_up_s, 2),
            "ms_per_commit": round(catch_up_s * 1000 / max(1, indexed), 3),
        },
        "history_versions": latest - first + 1,
        "history_from": first,
        "table_version": latest,
        "commits_shown": len(doc.commits),
        "messages_shown": len(doc.messages),
        "within_200ms": stats["p95_ms"] <= GOAL_MS,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10,000 documents, 1,000 commits")
    parser.add_argument("--documents", type=int)
    parser.add_argument("--commits", type=int)
    parser.add_argument("--every", type=int, help="the traced document every N-th commit")
    parser.add_argument("--repeat", type=int, help="timed traces (default 20)")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="build the table in DIR and keep it; a later run with the same DIR and sizes "
        "measures it again without rebuilding (the results say when it was built)",
    )
    add_output_options(parser)
    args = parser.parse_args(argv)
    documents = args.documents or (1_000 if args.smoke else 10_000 if args.quick else 1_000_000)
    commits = args.commits or (50 if args.smoke else 1_000 if args.quick else 10_000)
    every = args.every or (10 if args.smoke else 100)
    repeat = args.repeat or (2 if args.smoke else 20)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-trace-")))
        else:
            root = args.keep
        settings, versions, build_s, fresh = _built(root, documents, commits, every)
        measured = measure(settings, repeat)
    data = {
        "documents": documents,
        "commits": commits,
        "traced_every": every,
        "traced_versions": versions,
        "history_build_s": round(build_s, 1),
        "table_built_in_this_run": fresh,  # else a --keep table an earlier run built
        **measured,
        "goal_ms": GOAL_MS,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    path = save(args, "trace_history", data)
    t = data["trace"]
    print(
        f"trace p50 {t['p50_ms']} ms, p95 {t['p95_ms']} ms over {data['history_versions']:,} "
        f"versions of history (floor p50 {data['floor']['p50_ms']} ms, feed read "
        f"{data['feed_read']['p50_ms']} ms, index catch-up {data['index_catch_up']}); "
        f"{data['commits_shown']} commits shown -> {path}"
    )


if __name__ == "__main__":
    main()

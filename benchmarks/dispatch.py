"""Dispatch benchmark: immediate dispatch over the SQL transport on SQLite.

    python -m benchmarks.dispatch            # the committed figures (results/dispatch.json)
    python -m benchmarks.dispatch --quick    # the same shape, fewer rounds, under a minute
    python -m benchmarks.dispatch --profile  # cProfile of the 1,000-document case, top 25

For 1, 100 and 1,000 documents per unit of work (one message each), it measures:

* ``messages_per_second``: messages / (commit returned -> every send settled and the watermark
  written), i.e. the whole cost of dispatch after the commit;
* ``p50_ms`` / ``p99_ms``: per message, commit returned -> its send settled;
* ``watermark_merge``: the one ``advance_watermarks`` MERGE per commit (p50/p99 ms).

Each size runs twice: ``per_document`` (one send per document, ``max_in_flight`` of them at once:
the "before") and ``coalesced`` (documents batched into one atomic send of up to 500 messages: the
"after"). Results go to ``benchmarks/results/dispatch.json`` (``--quick``: ``dispatch.quick.json``).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, summarize_ms, write_results
from outbox.app import Outbox

SIZES = (1, 100, 1000)


def run_case(root: Path, docs: int, rounds: int, *, coalesce: bool) -> dict[str, Any]:
    ws = root / f"ws-{docs}-{coalesce}"
    with Outbox.open(ws, default_destination="shipments", transport="sql") as ob:
        runtime = ob.runtime
        runtime.dispatcher.coalesce = coalesce
        with ob.unit_of_work() as uow:  # warm up: table, queue, connection pool, thread pool
            uow.create("warm-up", type="Shipment").send("Created", {"i": 0})
        runtime.metrics.reset()
        saves: list[float] = []
        for r in range(rounds):
            t0 = time.perf_counter()
            with ob.unit_of_work() as uow:
                for i in range(docs):
                    doc = uow.create(f"r{r}-d{i}", type="Shipment", state={"status": "created"})
                    doc.send("StatusChanged", {"status": "left Seattle", "i": i})
            saves.append(time.perf_counter() - t0)
        m = runtime.metrics
        assert m["messages_sent"] == docs * rounds, m.snapshot()
        assert ob.store.scan_pending().num_rows == 0, "dispatch left documents pending"
        dispatch_s = list(m.dispatch_latency)
        settle = summarize_ms(list(m.settle_latency))
        return {
            "docs_per_unit_of_work": docs,
            "rounds": rounds,
            "messages": docs * rounds,
            "messages_per_second": round(docs * rounds / sum(dispatch_s), 1),
            "p50_ms": settle["p50_ms"],
            "p99_ms": settle["p99_ms"],
            "dispatch_ms": summarize_ms(dispatch_s),
            "watermark_merge": summarize_ms(list(m.watermark_latency)),
            "save_ms": summarize_ms(saves),
            "send_calls": m["send_calls"],
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, under a minute")
    parser.add_argument("--profile", action="store_true", help="cProfile the 1,000-doc case")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-dispatch-"))
    try:
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_case(root, 1000, 3, coalesce=True)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            return
        rounds = {1: 20, 100: 5, 1000: 2} if args.quick else {1: 100, 100: 20, 1000: 5}
        results: dict[str, Any] = {"machine": machine(), "transport": "sql (SQLite)", "cases": {}}
        for docs in SIZES:
            for coalesce in (False, True):
                name = f"{docs}_docs_{'coalesced' if coalesce else 'per_document'}"
                case = run_case(root, docs, rounds[docs], coalesce=coalesce)
                results["cases"][name] = case
                print(
                    f"{name:>26}: {case['messages_per_second']:>9.1f} msg/s  "
                    f"p50 {case['p50_ms']:>8.2f} ms  p99 {case['p99_ms']:>8.2f} ms  "
                    f"watermark p50 {case['watermark_merge']['p50_ms']:>7.2f} ms  "
                    f"sends {case['send_calls']}"
                )
        best = results["cases"]["1000_docs_coalesced"]
        results["messages_per_second"] = best["messages_per_second"]
        results["p99_ms"] = best["p99_ms"]
        results["headline"] = "1,000 documents per unit of work, coalesced sends"
        path = write_results("dispatch.quick" if args.quick else "dispatch", results)
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

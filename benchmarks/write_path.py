"""Write-path benchmark: unit_of_work vs the same save in raw deltalake calls, batch saves, and
file growth.

    python -m benchmarks.write_path            # everything, incl. 10,000 commits and buckets
    python -m benchmarks.write_path --quick    # the save/raw ratio and batches, under a minute
    python -m benchmarks.write_path --smoke    # every step of the full run, a few commits each
    python -m benchmarks.write_path --ratio-only   # rerun the save/raw ratio into write_path.json
    python -m benchmarks.write_path --long-only    # rerun the 10,000-commit runs likewise

A full run writes benchmarks/results/write_path.json; ``--quick`` and ``--smoke`` write
write_path.quick.json / write_path.smoke.json into a fresh temporary folder, never into
benchmarks/results/, and ``--out DIR`` chooses the folder (benchmarks/common.py says the rule).
``--ratio-only`` and ``--long-only`` start from the committed file (or the one already in
``--out``) and replace their sections in it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import (
    RESULTS,
    add_output_options,
    results_dir,
    results_name,
    save,
    summarize_ms,
    write_results,
)
from migrations.runner import migrate
from outbox.app.facade import Outbox
from outbox.app.maintenance import AutoCompactor, AutoLogTrimmer, compact
from outbox.core.clock import SystemClock
from outbox.core.model import DocumentRow, OutboxMessage, message_id_for
from outbox.core.settings import Settings
from outbox.delta import schema as S
from outbox.delta.log import list_log
from outbox.delta.store import DeltaDocumentStore

log = logging.getLogger("benchmarks.write_path")

#: The long run's log retention: twice the shortest rescue delay. The log then holds about 30 s
#: of commits (~500 files at this machine's rate), reached within the first window, so the run
#: shows the steady state. Production keeps ``log_retention`` (default 1 h) times the commit
#: rate files; docs/delta.md gives the cost per file to size it.
LONG_RUN_LOG_RETENTION = 30.0


def _outbox(ws: Path, buckets: int = 16) -> Outbox:
    settings = Settings(workspace=ws, buckets=buckets, compact_every=0)
    ws.mkdir(parents=True, exist_ok=True)
    DeltaDocumentStore.create(settings.table_uri, buckets=buckets)
    store = DeltaDocumentStore(settings.table_uri)
    return Outbox(settings, store, clock=SystemClock())


def _seed(ob: Outbox, n: int) -> None:
    for start in range(0, n, 1000):
        with ob.unit_of_work() as uow:
            for i in range(start, min(n, start + 1000)):
                uow.create(f"seed-{i}", type="Shipment", state={"status": "created", "i": i})
    compact(ob.store)


def _raw_row(ob: Outbox, doc_id: str, version: int) -> pa.Table:
    now = SystemClock().now()
    row = DocumentRow(
        id=doc_id,
        type="Shipment",
        version=version,
        state={"status": "left-seattle"},
        last_seq=version,
        dispatched_seq=0,
        outbox=[
            OutboxMessage(
                seq=version,
                message_id=message_id_for(ob.store.table_id, doc_id, version),
                destination="shipments",
                type="ShipmentStatusChanged",
                body='{"status":"left-seattle"}',
                ordering_key=doc_id,
                created_at=now,
            )
        ],
        updated_at=now,
    )
    return S.table_from_rows([(row, ob.store.bucket(doc_id))], extra={})


def _raw_save(ob: Outbox, doc_id: str, version: int) -> None:
    """The floor: what a save does, without the framework around it. Build the row, refresh the
    handle the store's way (``store.refresh()``: a stat of the next log file, and
    ``update_incremental`` only when the table moved), read the id's current rows (the
    optimistic check: an append has no predicate of its own, so a create that never read its
    id pays this read in the save, and an update in its ``get``), then append the row with its
    per-document application transaction (``outbox.delta.appends``), in raw deltalake calls.
    """
    from deltalake import CommitProperties, QueryBuilder, Transaction, write_deltalake

    source = _raw_row(ob, doc_id, version)
    ob.store.refresh()
    dt = ob.store.delta_table
    sql = (
        "SELECT id, version, dispatched_seq, incarnation FROM t "
        f"WHERE bucket IN ({ob.store.bucket(doc_id)}) AND id IN ('{doc_id}')"
    )
    pa.RecordBatchReader.from_stream(QueryBuilder().register("t", dt).execute(sql)).read_all()
    txn = Transaction(f"outbox:doc:{doc_id}", version, last_updated=int(time.time() * 1000))
    write_deltalake(
        dt, source, mode="append", commit_properties=CommitProperties(app_transactions=[txn])
    )


def _uow_create(ob: Outbox, doc_id: str) -> None:
    with ob.unit_of_work() as uow:
        d = uow.create(doc_id, type="Shipment", state={"status": "left-seattle"})
        d.send("ShipmentStatusChanged", {"status": "left-seattle"}, destination="shipments")


def _uow_update(ob: Outbox, doc_id: str) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.get(doc_id)
        assert doc is not None
        doc.state["status"] = "reached-des-moines"
        doc.send("ShipmentStatusChanged", {"status": "reached-des-moines"}, destination="shipments")


def _time(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


#: What the results file says about how the ratio was taken (``ratio.notes``).
RATIO_NOTES = (
    "Both sides do the same work inside the timed region: build the row, refresh the handle "
    "the store's way (a stat of the next log file; update_incremental only when the table "
    "moved), read the id's rows (the optimistic check; for an update, the get), append the row "
    "with its per-document application transaction. The two sides are interleaved sample by "
    "sample on one table (raw insert, unit-of-work create, raw update, unit-of-work update per "
    "round, with the order of raw and unit of work swapped every other round), so machine load "
    "and file growth hit both alike. The machine was shared with other jobs during the run "
    "(load_average_1m: the 1-minute load average before and after it)."
)


def bench_ratio(base: Path, rounds: int, seed_docs: int) -> dict[str, Any]:
    """Interleave raw saves and units of work sample by sample so load and file growth hit
    both alike; alternate which side goes first so neither always follows the other."""
    ob = _outbox(base / "ratio")
    _seed(ob, seed_docs)
    load_before = os.getloadavg()[0]
    raw_insert: list[float] = []
    uow_create: list[float] = []
    raw_update: list[float] = []
    uow_update: list[float] = []
    for i in range(rounds):
        raw_id, uow_id = f"raw-{i}", f"uow-{i}"
        steps: list[tuple[list[float], Callable[[], None]]] = [
            (raw_insert, partial(_raw_save, ob, raw_id, 1)),
            (uow_create, partial(_uow_create, ob, uow_id)),
        ]
        updates: list[tuple[list[float], Callable[[], None]]] = [
            (raw_update, partial(_raw_save, ob, raw_id, 2)),
            (uow_update, partial(_uow_update, ob, uow_id)),
        ]
        if i % 2:
            steps.reverse()
            updates.reverse()
        for samples, fn in steps + updates:
            samples.append(_time(fn))
    ob.close()
    med = statistics.median
    return {
        "rounds": rounds,
        "seed_docs": seed_docs,
        "raw_insert": summarize_ms(raw_insert),
        "uow_create_and_send": summarize_ms(uow_create),
        "raw_update": summarize_ms(raw_update),
        "uow_get_change_send": summarize_ms(uow_update),
        "save_vs_raw_ratio": round(med(uow_create) / med(raw_insert), 3),
        "update_vs_raw_ratio": round(med(uow_update) / med(raw_update), 3),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "notes": RATIO_NOTES,
    }


def bench_batches(base: Path, sizes: list[int], commits: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        ob = _outbox(base / f"batch-{n}")
        samples = []
        for c in range(commits):
            t = time.perf_counter()
            with ob.unit_of_work() as uow:
                for i in range(n):
                    d = uow.create(f"b{c}-{i}", type="Shipment", state={"status": "created"})
                    d.send("ShipmentCreated", {"n": i}, destination="shipments")
            samples.append(time.perf_counter() - t)
        med = statistics.median(samples)
        out[str(n)] = {
            **summarize_ms(samples),
            "documents_per_second": round(n / med, 1),
        }
        ob.close()
    return out


def bench_group_commit(base: Path, threads: int, per_thread: int) -> dict[str, Any]:
    """Threads in one process each saving single-document units of work."""
    import threading

    out: dict[str, Any] = {}
    for group in (False, True):
        ob = _outbox(base / f"group-{group}")
        ob.store.group_commit = group

        def work(t: int, ob: Outbox = ob) -> None:
            for i in range(per_thread):
                with ob.unit_of_work() as uow:
                    uow.create(f"t{t}-{i}", type="T").send("E", {"i": i}, destination="q")

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        out["on" if group else "off"] = {
            "units_per_second": round(threads * per_thread / elapsed, 1),
            "commits": ob.store.refresh(),
            "group_commits": ob.store.group_commits,
        }
        ob.close()
    out["speedup"] = round(out["on"]["units_per_second"] / out["off"]["units_per_second"], 2)
    out["threads"] = threads
    return out


def _files(ob: Outbox) -> int:
    ob.store.delta_table.update_incremental()
    return len(ob.store.delta_table.file_uris())


def bench_growth(
    base: Path,
    commits: int,
    *,
    compact_every: int,
    window: int,
    seed_docs: int = 2000,
    log_retention: float | None = None,
) -> dict[str, Any]:
    """Commits that each update one document and create one: latency per window of commits.

    The creates add a small file per commit (what compaction folds back); the table also grows
    by ``commits`` documents, which by itself makes each copy-on-write update a little dearer,
    so the long run starts from a larger seed to keep that share small. ``log_retention`` turns
    on the writer's log trim (every ``compact_every`` versions, as ``Outbox.open`` wires it):
    deltalake lists the whole ``_delta_log`` after every commit, so its length is the other
    thing that grows (docs/delta.md).
    """
    name = f"growth-{compact_every}-{commits}-{log_retention}"
    ob = _outbox(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base)))  # a fresh table per run
    _seed(ob, seed_docs)
    compactor = AutoCompactor(ob.store, compact_every) if compact_every else None
    if compactor:
        ob.add_commit_listener(compactor)
    trimmer = None
    if log_retention is not None:
        migrate(ob.settings)  # the rescuer checkpoints the trim must respect (none here)
        trimmer = AutoLogTrimmer(
            ob.store,
            compact_every or 100,
            sql_url=ob.settings.sql_url,
            retention_seconds=log_retention,
            clock=SystemClock(),
        )
        ob.add_commit_listener(trimmer)
    windows: list[dict[str, Any]] = []
    samples: list[float] = []
    for i in range(commits):
        doc_id = f"seed-{i % seed_docs}"
        t = time.perf_counter()
        with ob.unit_of_work() as uow:  # a status update and a new document per commit
            d = uow.get(doc_id)
            assert d is not None
            d.state["n"] = i
            d.send("Tick", {"n": i}, destination="ticks")
            uow.create(f"new-{i}", type="Shipment").send("Created", {}, destination="ticks")
        samples.append(time.perf_counter() - t)
        if (i + 1) % window == 0:
            windows.append(
                {
                    "commits": i + 1,
                    **summarize_ms(samples),
                    "files": _files(ob),
                    "log_files": len(list_log(ob.store.uri)),
                }
            )
            log.info("%s: %s", name, windows[-1])
            samples = []
    first, last = windows[0]["p50_ms"], windows[-1]["p50_ms"]
    p50s = [w["p50_ms"] for w in windows]
    return {
        "commits": commits,
        "seed_docs": seed_docs,
        "compact_every": compact_every,
        "log_retention_s": log_retention,
        "windows": windows,
        "first_window_p50_ms": first,
        "last_window_p50_ms": last,
        "last_over_first": round(last / first, 3),
        "max_over_min_window_p50": round(max(p50s) / min(p50s), 3),
        "compactions": compactor.runs if compactor else 0,
        "log_trims": trimmer.runs if trimmer else 0,
    }


def bench_long(
    base: Path, commits: int, *, every: int = 100, window: int = 1000, seed_docs: int = 20_000
) -> dict[str, Any]:
    """The 10,000-commit runs: compaction alone, then compaction plus the log trim."""
    return {
        "long_run_compaction_only": bench_growth(
            base, commits, compact_every=every, window=window, seed_docs=seed_docs
        ),
        "long_run_with_upkeep": bench_growth(
            base,
            commits,
            compact_every=every,
            window=window,
            seed_docs=seed_docs,
            log_retention=LONG_RUN_LOG_RETENTION,
        ),
    }


#: ``--smoke``: every step of the full run once, on a few documents and commits: the growth
#: runs' (commits, compact_every, window) and the long runs' arguments, two windows each with
#: an upkeep run (compaction, log trim) at the end of each.
SMOKE_GROWTH = (4, 2, 2)
SMOKE_LONG = {"commits": 4, "every": 2, "window": 2, "seed_docs": 20}


def _bucket_writer(ws: str, who: int, commits: int, barrier: Any, out: Any) -> None:
    settings = Settings(workspace=Path(ws), compact_every=0)
    store = DeltaDocumentStore(settings.table_uri, max_commit_retries=50)
    ob = Outbox(settings, store, clock=SystemClock())
    barrier.wait()
    t = time.perf_counter()
    for i in range(commits):  # updates of this writer's own documents: disjoint ids
        with ob.unit_of_work() as uow:
            d = uow.get(f"w{who}-{i % 50}")
            assert d is not None
            d.state["n"] = i
            d.send("E", {}, destination="q")
    out.put((store.commit_retries, time.perf_counter() - t))


def bench_buckets(base: Path, options: list[int], commits: int) -> dict[str, Any]:
    """Two writer processes on disjoint documents: how N buckets changes conflicts."""
    ctx = mp.get_context("spawn")
    result: dict[str, Any] = {}
    for n in options:
        ws = base / f"buckets-{n}"
        ob = _outbox(ws, buckets=n)
        with ob.unit_of_work() as uow:
            for w in (1, 2):
                for i in range(50):
                    uow.create(f"w{w}-{i}", type="T")
        ob.close()
        barrier, q = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(target=_bucket_writer, args=(str(ws), w, commits, barrier, q))
            for w in (1, 2)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        stats = [q.get() for _ in procs]
        elapsed = max(s[1] for s in stats)
        result[str(n)] = {
            "commit_retries": sum(s[0] for s in stats),
            "commits_per_second": round(2 * commits / elapsed, 1),
        }
        log.info("buckets=%d: %s", n, result[str(n)])
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="ratio and batches only (< 1 minute)")
    ap.add_argument("--long-commits", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the ratio comparison")
    add_output_options(ap)
    only = ap.add_mutually_exclusive_group()
    only.add_argument(
        "--long-only",
        action="store_true",
        help="rerun only the long runs and replace them in write_path.json",
    )
    only.add_argument(
        "--ratio-only",
        action="store_true",
        help="rerun only the unit-of-work vs raw MERGE comparison and replace it in "
        "write_path.json",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    smoke = args.smoke
    rounds = args.rounds or (2 if smoke else 25 if args.quick else 100)
    seed_docs = 20 if smoke else 2000
    long: dict[str, int] = SMOKE_LONG if smoke else {"commits": args.long_commits}
    base = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    try:
        if args.long_only:
            _update_sections(args, "long_runs", bench_long(base, **long))
            return
        if args.ratio_only:
            ratio = bench_ratio(base, rounds=rounds, seed_docs=seed_docs)
            log.info("ratio: %s", ratio)
            _update_sections(
                args,
                "ratio",
                {"ratio": ratio, "save_vs_raw_ratio": ratio["save_vs_raw_ratio"]},
            )
            return
        data: dict[str, Any] = {"quick": args.quick}
        data["ratio"] = bench_ratio(base, rounds=rounds, seed_docs=seed_docs)
        data["save_vs_raw_ratio"] = data["ratio"]["save_vs_raw_ratio"]
        log.info("ratio: %s", data["ratio"])
        batch_commits = 2 if smoke else 3 if args.quick else 5
        data["batches"] = bench_batches(
            base, [10] if smoke else [1, 100, 1000], commits=batch_commits
        )
        log.info("batches: %s", data["batches"])
        data["group_commit"] = bench_group_commit(
            base, threads=2 if smoke else 8, per_thread=2 if smoke else 5 if args.quick else 20
        )
        log.info("group commit: %s", data["group_commit"])
        if not args.quick:
            commits, every, window = SMOKE_GROWTH if smoke else (1000, 100, 100)
            data["growth_without_upkeep"] = bench_growth(
                base, commits, compact_every=0, window=window, seed_docs=seed_docs
            )
            data["growth_with_compaction_every_100"] = bench_growth(
                base, commits, compact_every=every, window=window, seed_docs=seed_docs
            )
            data["buckets"] = bench_buckets(
                base, [4] if smoke else [1, 4, 16, 64], commits=3 if smoke else 40
            )
            data.update(bench_long(base, **long))
        path = save(args, "write_path", data)
        print(f"save_vs_raw_ratio = {data['save_vs_raw_ratio']}  ({path})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _update_sections(args: argparse.Namespace, what: str, sections: dict[str, Any]) -> None:
    """Replace ``sections`` in the results and keep every other section as measured: in the
    file already in the output folder, else in a copy of the committed one.

    The file records when each partial rerun was taken (``<what>_measured_at``) and when the
    rest was (``other_sections_measured_at``), so no figure loses its date.
    """
    import json

    to = results_dir(args.out, quick=args.quick or args.smoke)
    stem = results_name("write_path", quick=args.quick, smoke=args.smoke)
    path = to / f"{stem}.json"
    data = json.loads((path if path.exists() else RESULTS / "write_path.json").read_text())
    data.pop("benchmark", None)
    measured = data.pop("measured_at", None)
    data.pop("machine", None)
    data.setdefault("other_sections_measured_at", measured)
    data.update(sections)
    data[f"{what}_measured_at"] = datetime.now(UTC).isoformat()
    out = write_results(stem, data, to=to)
    print(f"{what} updated in {out}")


if __name__ == "__main__":
    main()

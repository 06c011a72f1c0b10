"""The document table at scale, through the product (issue 31): ``benchmarks.doc_table``'s
``outbox``, ``writers`` and ``disk`` parts.

* ``outbox`` (per size): a table of N documents as ``outbox maintain`` leaves it (one file per
  bucket, checkpointed), then ``commits`` units of work, each ``get_many`` of 100 random
  documents, a state change and one message each, then commit; after each, the dispatcher's
  watermark for those 100 (``advance_watermarks``, a mark row each). Reported: ``get_many``,
  commit and watermark latency (p50, p90), the bytes each commit wrote (from its log entry) over
  the changed rows' bytes, a point ``get``, ``scan_pending`` (what ``outbox status`` and the
  rescuer's sweep read), a rescuer feed pass over the commits, and the upkeep after them (fold
  and compaction: time, rows removed, bytes rewritten).
* ``writers``: four processes, each changing 100 random documents of its own quarter of the
  table per unit of work, all started together: commits, conflicts retried, ``ConcurrencyError``.
* ``disk``: a timed run of 100-document commits over 5,000 documents through ``Outbox.open``
  (immediate dispatch to the in-memory transport, so watermarks ride along as in production) with
  the writers' upkeep on its documented schedule (``compact_every`` 100: fold, compaction, log
  trim), sampled every few seconds: bytes on disk against the live table plus the window of
  files the rescuer may still read (those added within ``log_retention``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import percentile, rescue_pass_since, timed

CHANGED = 100
LOAD_CHUNK = 100_000
#: The disk run's table and schedule: the issue's 5,000 documents; a one-minute log retention
#: (the rescuer's window) and a 15 s rescue delay, the shortest the settings allow.
DISK_DOCS = 5_000
DISK_RETENTION_S = 60.0
DISK_SAMPLE_S = 5.0
FOLD_EVERY_S = 1.0
#: P16: a due bucket not folded within this many seconds is starved.
STARVED_AFTER_S = 10.0


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "p90_ms": round(percentile(values, 90) * 1000, 1),
    }


def _settings(root: Path, **overrides: Any) -> Any:
    from outbox.core.settings import Settings

    return Settings(workspace=root, **overrides)


def build(root: Path, size: int) -> Any:
    """A migrated outbox whose table holds ``size`` documents (version 1, their one message
    sent), compacted and checkpointed as ``outbox maintain`` leaves it."""
    from deltalake import write_deltalake

    from benchmarks.doc_table import _rows
    from migrations.runner import migrate
    from outbox.delta.compaction import compact
    from outbox.delta.store import DeltaDocumentStore

    settings = _settings(root, compact_every=0)
    migrate(settings)
    ids = [f"doc-{i:09d}" for i in range(size)]
    for start in range(0, size, LOAD_CHUNK):
        rows = _rows(ids[start : start + LOAD_CHUNK], 1)
        sent = pa.array([1] * rows.num_rows, pa.int64())  # every message already dispatched
        rows = rows.set_column(
            rows.schema.get_field_index("dispatched_seq"), "dispatched_seq", sent
        )
        write_deltalake(settings.table_uri, rows, mode="append")
    store = DeltaDocumentStore(settings.table_uri)
    compact(store)
    store.refresh()
    store.delta_table.create_checkpoint()
    store.close()
    return settings


def _commit_bytes(uri: str, version: int) -> int:
    from benchmarks.doc_table import _commit_bytes as raw

    return raw(Path(uri), version)["total"]


def run_outbox(root: Path, size: int, commits: int, rng: random.Random) -> dict[str, Any]:
    from benchmarks.doc_table import _floor_bytes
    from outbox.app.facade import Outbox
    from outbox.core.clock import SystemClock
    from outbox.delta.store import DeltaDocumentStore

    settings = build(root, size)
    store = DeltaDocumentStore(settings.table_uri)
    ob = Outbox(settings, store, clock=SystemClock())
    samples = [[f"doc-{i:09d}" for i in rng.sample(range(size), CHANGED)] for _ in range(commits)]
    base = store.version()
    reads, saves, marks, save_bytes, mark_bytes = [], [], [], [], []
    for n, sample in enumerate(samples):
        t0 = time.perf_counter()
        uow = ob.unit_of_work()
        docs = uow.get_many(sample)
        t1 = time.perf_counter()
        for d in docs.values():
            d.state["status"] = f"step-{n}"
            d.send("ShipmentStatusChanged", {"status": f"step-{n}"}, destination="shipments")
        version = uow.commit()
        t2 = time.perf_counter()
        assert version is not None
        reads.append(t1 - t0)
        saves.append(t2 - t1)
        save_bytes.append(_commit_bytes(store.uri, version))
        rows = store.read(sample, barrier=False)[1]
        t3 = time.perf_counter()
        mark = store.advance_watermarks(
            {i: r.last_seq for i, r in rows.items()}, {i: r.incarnation for i, r in rows.items()}
        )
        marks.append(time.perf_counter() - t3)
        assert mark is not None
        mark_bytes.append(_commit_bytes(store.uri, mark))
    floor = _floor_bytes(samples[0])
    out: dict[str, Any] = {
        "get_many_100": _ms(reads),
        "commit": _ms(saves),
        "commit_bytes": int(statistics.median(save_bytes)),
        "commit_bytes_over_changed_rows": round(statistics.median(save_bytes) / floor, 1),
        "watermark": _ms(marks),
        "watermark_bytes": int(statistics.median(mark_bytes)),
        "commit_retries": store.commit_retries,
    }
    out["get_1"] = _ms(timed(lambda: ob.unit_of_work().get(samples[0][0]), 5))
    out["scan_pending"] = _ms(timed(store.scan_pending, 3))
    out["rescuer_feed_pass"] = _feed_pass(store, base, commits)
    out["upkeep"] = _upkeep(store)
    ob.close()
    return out


def _feed_pass(store: Any, base: int, commits: int) -> dict[str, Any]:
    """One rescuer pass over every commit since ``base`` (local engine), all of them old enough."""
    from rescuer.cdf_local import LocalEngine

    later = datetime.now(UTC) + timedelta(hours=1)
    rescue = rescue_pass_since(store, base, engine=LocalEngine(), now=later, delay=15)
    t0 = time.perf_counter()
    report = rescue.run()
    return {
        "seconds": round(time.perf_counter() - t0, 3),
        "mode": report.mode,
        "commits_read": commits * 2,
        "change_rows": report.change_rows,
        "enqueued": report.commands_enqueued,
    }


def _upkeep(store: Any) -> dict[str, Any]:
    """What ``outbox maintain`` does first after the commits: the fold, then the compaction."""
    from outbox.delta.compaction import compact
    from outbox.delta.fold import fold_table

    before = store.refresh()
    t0 = time.perf_counter()
    folded = fold_table(store)
    t1 = time.perf_counter()
    compact(store)
    t2 = time.perf_counter()
    after = store.refresh()
    written = sum(_commit_bytes(store.uri, v) for v in range(before + 1, after + 1))
    return {
        "fold_s": round(t1 - t0, 3),
        "compact_s": round(t2 - t1, 3),
        "rows_removed": folded.rows_removed,
        "buckets_folded": len(folded.buckets),
        "bytes_written": written,
    }


# --- four writers ---------------------------------------------------------------------------


def _writer(uri: str, ids: list[str], commits: int, seed: int, pipes: tuple[Any, Any, Any]) -> None:
    from outbox.app.facade import Outbox
    from outbox.core.clock import SystemClock
    from outbox.core.errors import CommitConflictError, ConcurrencyError
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore

    rng = random.Random(seed)
    store = DeltaDocumentStore(uri)
    ob = Outbox(Settings(table_uri=uri, compact_every=0), store, clock=SystemClock())
    stale = gave_up = 0
    latencies = []
    ready, start, out = pipes
    ready.put(seed)
    start.wait()
    for n in range(commits):
        t0 = time.perf_counter()
        try:
            with ob.unit_of_work() as uow:
                for d in uow.get_many(rng.sample(ids, CHANGED)).values():
                    d.state["n"] = n
                    d.send("Changed", {"n": n}, destination="q")
        except ConcurrencyError:
            stale += 1
        except CommitConflictError:
            gave_up += 1
        latencies.append(time.perf_counter() - t0)
    out.put(
        {
            "commits": commits,
            "retries": store.commit_retries,
            "concurrency_errors": stale,
            "gave_up": gave_up,
            "latency_p50_ms": round(statistics.median(latencies) * 1000, 1),
        }
    )
    ob.close()


def run_writers(root: Path, size: int, commits: int, writers: int = 4) -> dict[str, Any]:
    """Two rounds on one table: the writers alone (their conflicts with each other), then with
    a fold every second beside them."""
    settings = build(root, size)
    return {
        "writers": writers,
        "documents": size,
        "alone": _writers_round(settings.table_uri, size, commits, writers, fold=False),
        "with_folds": _writers_round(settings.table_uri, size, commits, writers, fold=True),
    }


def _writers_round(
    uri: str, size: int, commits: int, writers: int, *, fold: bool
) -> dict[str, Any]:
    ids = [f"doc-{i:09d}" for i in range(size)]
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    quarter = size // writers
    procs = [
        ctx.Process(
            target=_writer,
            args=(uri, ids[w * quarter : (w + 1) * quarter], commits, w, (ready, start, out)),
        )
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # every process has imported and opened the table
        ready.get(timeout=600)
    t0 = time.perf_counter()
    start.set()
    if fold:
        folds = _fold_while(uri, out, len(procs))
        results = folds.pop("results")
    else:
        folds, results = {}, [out.get(timeout=1800) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    total = sum(r["commits"] for r in results)
    retries = sum(r["retries"] for r in results)
    return {
        "commits": total,
        "retries": retries,
        "retries_per_commit": round(retries / total, 3),
        "concurrency_errors": sum(r["concurrency_errors"] for r in results),
        "gave_up": sum(r["gave_up"] for r in results),
        "commits_per_second": round(total / wall, 1),
        "commit_p50_ms": sorted(r["latency_p50_ms"] for r in results)[len(results) // 2],
        **({"folds": folds} if fold else {}),
    }


def _fold_while(uri: str, out: Any, writers: int) -> dict[str, Any]:
    """Fold every bucket with anything to fold, once a second while the writers run (an
    ``outbox maintain`` beside them, far more often than the schedule asks): how many bucket
    folds committed, how many a writer made skip. Returns that and the writers' results. Each
    fold that commits makes the appends in flight retry (it removed data): the writers'
    ``retries`` count those too.

    Starvation (P16's second half): a bucket is waiting from the start of the first pass that
    found it due and could not fold it (a writer committed meanwhile) until a pass folds it;
    ``fold_waits_s`` are the waits of the buckets that had to wait (one folded at its first try
    waited for nothing), ``longest_wait_s`` the longest, counting the buckets still waiting when
    the writers finished (their wait so far), and ``starved`` how many waited longer than
    ``STARVED_AFTER_S``."""
    import queue

    from outbox.delta.fold import fold_table
    from outbox.delta.store import DeltaDocumentStore

    store = DeltaDocumentStore(uri)
    done, skipped, results = 0, 0, []
    waiting: dict[int, float] = {}  # bucket -> start of the first pass that had to skip it
    waits: list[float] = []
    while len(results) < writers:
        started = time.perf_counter()
        report = fold_table(store, at=0)
        landed = time.perf_counter()
        done += len(report.buckets)
        skipped += len(report.skipped)
        for b in report.skipped:
            waiting.setdefault(b, started)
        waits += [landed - waiting.pop(b) for b in report.buckets if b in waiting]
        try:
            while True:
                results.append(out.get(timeout=FOLD_EVERY_S))
        except queue.Empty:
            pass
    end = time.perf_counter()
    store.close()
    ages = waits + [end - since for since in waiting.values()]
    return {
        "bucket_folds": done,
        "bucket_folds_skipped": skipped,
        "fold_waits_s": [round(w, 2) for w in sorted(waits)],
        "still_waiting_at_end": len(waiting),
        "longest_wait_s": round(max(ages, default=0.0), 2),
        "starved": sum(1 for a in ages if a > STARVED_AFTER_S),
        "starved_after_s": STARVED_AFTER_S,
        "results": results,
    }


# --- disk use over a run with the writers' upkeep ------------------------------------------------


def _disk(uri: str) -> int:
    return sum(p.stat().st_size for p in Path(uri).rglob("*") if p.is_file())


def _live_and_window(store: Any, retention_s: float) -> tuple[int, int]:
    """Bytes of the current snapshot's files, and of the files added (data and change data) by
    the commits within ``retention_s``: what a rescuer still reading that window needs."""
    store.refresh()
    live = sum(
        int(s) for s in store.delta_table.get_add_actions(flatten=True)["size_bytes"].to_pylist()
    )
    cutoff = time.time() - retention_s
    window = 0
    log_dir = Path(store.uri) / "_delta_log"
    for entry in log_dir.glob("*.json"):
        if entry.stat().st_mtime < cutoff:
            continue
        for line in entry.read_text().splitlines():
            a = json.loads(line) if line else {}
            for kind in ("add", "cdc"):
                if kind in a:
                    window += int(a[kind]["size"])
    return live, window


def run_disk(
    root: Path, seconds: float, rng: random.Random, docs: int = DISK_DOCS
) -> dict[str, Any]:
    """Commits for ``seconds`` (at least one: a smoke run gives 0) on a table of ``docs``."""
    from outbox.app.facade import Outbox

    settings = build(root, docs)
    settings = settings.replace(
        compact_every=100, log_retention=DISK_RETENTION_S, rescue_delay=15.0
    )
    ob = Outbox.open(settings=settings, create=False, transport="memory")
    ids = [f"doc-{i:09d}" for i in range(docs)]
    samples: list[dict[str, Any]] = []
    commits = 0
    t0 = time.monotonic()
    next_sample = t0
    while not commits or time.monotonic() - t0 < seconds:
        with ob.unit_of_work() as uow:
            for d in uow.get_many(rng.sample(ids, CHANGED)).values():
                d.state["n"] = commits
                d.send("Changed", {"n": commits}, destination="q")
        commits += 1
        if time.monotonic() >= next_sample:
            next_sample += DISK_SAMPLE_S
            live, window = _live_and_window(ob.store, DISK_RETENTION_S)
            disk = _disk(ob.store.uri)
            samples.append(
                {
                    "t_s": round(time.monotonic() - t0, 1),
                    "commits": commits,
                    "disk_bytes": disk,
                    "live_bytes": live,
                    "window_bytes": window,
                    "ratio": round(disk / (live + window), 2),
                    "files": sum(1 for _ in Path(ob.store.uri).rglob("*.parquet")),
                }
            )
    ob.close()
    steady = samples[len(samples) * 2 // 3 :] or samples
    return {
        "seconds": seconds,
        "documents": docs,
        "commits": commits,
        "log_retention_s": DISK_RETENTION_S,
        "compact_every": 100,
        "max_ratio_last_third": max(s["ratio"] for s in steady),
        "max_disk_bytes": max(s["disk_bytes"] for s in samples),
        "last": samples[-1],
        "samples": samples,
    }


# --- the application transactions' cost in the table's state -----------------------------------


def run_txn_state(root: Path, app_ids: int) -> dict[str, Any]:
    """What ``app_ids`` per-document application transactions (one per document saved within
    the transaction retention) cost: checkpoint bytes, opening the table, a refresh that finds
    one new commit. Against the same table without them."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    out: dict[str, Any] = {"app_ids": app_ids}
    for name, n in (("without", 0), ("with", app_ids)):
        uri = str(root / f"txn-{name}")
        write_deltalake(uri, pa.table({"id": ["seed"], "v": [0]}))
        now = int(time.time() * 1000)
        for start in range(0, n, LOAD_CHUNK):
            txns = [
                Transaction(f"outbox:doc:doc-{i:09d}", 1, last_updated=now)
                for i in range(start, min(n, start + LOAD_CHUNK))
            ]
            write_deltalake(
                uri,
                pa.table({"id": ["x"], "v": [1]}),
                mode="append",
                commit_properties=CommitProperties(app_transactions=txns),
            )
        DeltaTable(uri).create_checkpoint()
        log_dir = Path(uri) / "_delta_log"
        ckpt = sum(p.stat().st_size for p in log_dir.glob("*.checkpoint*.parquet"))
        opened = timed(lambda uri=uri: DeltaTable(uri), 3)
        reader, writer = DeltaTable(uri), DeltaTable(uri)
        refreshes = []
        for k in range(5):
            write_deltalake(writer, pa.table({"id": ["y"], "v": [k]}), mode="append")
            t0 = time.perf_counter()
            reader.update_incremental()
            refreshes.append(time.perf_counter() - t0)
        out[name] = {
            "checkpoint_bytes": ckpt,
            "open": _ms(opened),
            "refresh": _ms(refreshes),
        }
    return out

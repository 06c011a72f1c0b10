"""``benchmarks.table_state``'s timed runs: a writer of new documents at its full rate, from a table
of ``docs`` documents, with what runs beside it in production, sampled as it goes.

The writer is this process: ``Outbox.open`` with the SQL transport (SQLite, immediate dispatch),
each unit of work creating 100 new documents with one message each, back to back for
``minutes``. The ids are random, as a device's or an order's often are: no file's id range rules
a new id out, so the save's re-check reads every file of the buckets it touches. Beside it: a
consumer process draining the queue (receive and complete, 100 at a time) and, on a local table,
``outbox rescue --every 30s`` as its own process. A local table's upkeep is the writers' own
(``compact_every`` 100: fold, compaction, log trim); on an object store writers do not compact,
so the loop runs ``outbox maintain`` every ``MAINTAIN_EVERY`` versions, as
docs/object-storage.md schedules it.

Per commit: the store's ``save`` (refresh, re-check, append: the commit) and the whole unit of
work (its ``with`` block, dispatch and upkeep included). Every ``sample_s``, from a thread: the
bytes on disk by kind (live data files, data files no longer in the snapshot that the log window
still holds, change data, commit files, checkpoints, the rest), the files in ``_delta_log``, the
newest checkpoint's bytes and its transaction, tombstone and file rows, the time to open the
table, and this process's resident memory.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
DESTINATION = "devices"
DOCS_PER_UNIT = 100
MAINTAIN_EVERY = 200


def _ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 1) if values else None


# --- what runs beside the writer ---------------------------------------------------------------


def _consume(sql_url: str, stop: Any, consumed: Any) -> None:
    """Receive and complete everything sent to ``DESTINATION`` until ``stop`` is set and the
    queue is empty."""
    from dispatcher.queue import SqlQueue

    queue = SqlQueue(sql_url, lock_duration=300)
    while True:
        batch = queue.receive(DESTINATION, 100)
        for m in batch:
            queue.complete(m)
        with consumed.get_lock():
            consumed.value += len(batch)
        if not batch:
            if stop.is_set():
                break
            time.sleep(0.2)  # an idle consumer's poll, not a wait for an outcome
    queue.close()


def _rescuer(workspace: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "outbox.app.cli", "-w", str(workspace), "rescue", "--every", "30s"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


# --- sampling ----------------------------------------------------------------------------------


def _files(uri: str, options: dict[str, str]) -> list[tuple[str, int]]:
    """Every file of the table, (path relative to the table, bytes)."""
    if "://" not in uri or uri.startswith("file://"):
        base = Path(uri.removeprefix("file://"))
        return [
            (str(p.relative_to(base)), p.stat().st_size) for p in base.rglob("*") if p.is_file()
        ]
    import pyarrow.fs as pfs

    from outbox.delta.log import _filesystem

    fs = _filesystem(uri, options)
    infos = fs.get_file_info(pfs.FileSelector("", recursive=True, allow_not_found=True))
    return [(i.path.lstrip("/"), int(i.size or 0)) for i in infos if i.type == pfs.FileType.File]


def _kind(path: str, live: set[str]) -> str:
    name = path.rsplit("/", 1)[-1]
    if path.startswith("_delta_log/"):
        if ".checkpoint" in name:
            return "checkpoints"
        return "commits" if name.endswith(".json") else "log_other"
    if path.startswith("_change_data/"):
        return "change_data"
    if name.endswith(".parquet"):
        return "data_live" if path in live else "data_removed"
    return "other"


def _checkpoint(uri: str, options: dict[str, str], files: list[tuple[str, int]]) -> dict[str, Any]:
    """The newest checkpoint's bytes and rows by action."""
    cps = sorted((p, s) for p, s in files if p.startswith("_delta_log/") and ".checkpoint" in p)
    if not cps:
        return {"bytes": 0}
    path, size = cps[-1]
    if "://" in uri and not uri.startswith("file://"):
        from outbox.delta.log import _filesystem

        with _filesystem(uri, options).open_input_file(path) as f:
            table = pq.read_table(f, columns=["add", "remove", "txn"])
    else:
        table = pq.read_table(Path(uri) / path, columns=["add", "remove", "txn"])
    rows = {c: table.num_rows - table.column(c).null_count for c in ("add", "remove", "txn")}
    return {"bytes": size, "version": int(path.split("/")[-1][:20]), **rows}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6, 1)


def sample(uri: str, options: dict[str, str]) -> dict[str, Any]:
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    dt = DeltaTable(uri, storage_options=options or None)
    opened = time.perf_counter() - t0
    live = {unquote(str(p)) for p in dt.get_add_actions(flatten=True).column("path").to_pylist()}
    files = _files(uri, options)
    disk: dict[str, int] = {}
    for path, size in files:
        kind = _kind(path, live)
        disk[kind] = disk.get(kind, 0) + size
    total = sum(disk.values())
    return {
        "version": dt.version(),
        "open_ms": round(opened * 1000, 1),
        "log_files": sum(1 for p, _ in files if p.startswith("_delta_log/")),
        "commit_files": sum(1 for p, _ in files if _kind(p, live) == "commits"),
        "checkpoint": _checkpoint(uri, options, files),
        "disk": disk,
        "disk_bytes": total,
        "checkpoint_share": round(disk.get("checkpoints", 0) / total, 4) if total else 0.0,
        "rss_mb": _rss_mb(),
    }


class Monitor(threading.Thread):
    """Samples the table every ``every`` seconds until stopped."""

    def __init__(self, uri: str, options: dict[str, str], every: float, start: float) -> None:
        super().__init__(daemon=True)
        self.uri, self.options, self.every, self.start_at = uri, options, every, start
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self.extra: Callable[[], dict[str, Any]] = dict

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.take()

    def take(self) -> None:
        try:
            s = sample(self.uri, self.options)
        except Exception as e:  # a sample racing the trim: the next one will do
            s = {"error": f"{type(e).__name__}: {e}"[:300]}
        s = {"t_s": round(time.monotonic() - self.start_at, 1), **s, **self.extra()}
        self.samples.append(s)
        print("sample", json.dumps({k: v for k, v in s.items() if k != "disk"}), flush=True)


# --- the writer ----------------------------------------------------------------------------------


def _per_minute(commits: list[tuple[float, float, float]], minutes: int) -> list[dict[str, Any]]:
    out = []
    for m in range(minutes):
        inside = [c for c in commits if m * 60 <= c[0] < (m + 1) * 60]
        saves = [c[1] for c in inside]
        out.append(
            {
                "minute": m + 1,
                "commits": len(inside),
                "commit_p50_ms": _ms(saves),
                "commit_p90_ms": round(_pct(saves, 90) * 1000, 1) if saves else None,
                "unit_p50_ms": _ms([c[2] for c in inside]),
            }
        )
    return out


def _pct(values: list[float], p: float) -> float:
    from benchmarks.common import percentile

    return percentile(values, p)


def _window_p50(commits: list[tuple[float, float, float]], lo: float, hi: float) -> float | None:
    return _ms([c[1] for c in commits if lo <= c[0] < hi])


class _Upkeep:
    """``outbox maintain`` every ``every`` versions (an object store's schedule); None: off."""

    def __init__(self, store: Any, settings: Any, every: int | None) -> None:
        self.store, self.settings, self.every, self.runs = store, settings, every, 0
        self.next = (store.version() // every + 1) * every if every else 0

    def __call__(self) -> None:
        from outbox.app.maintenance import maintain
        from outbox.core.clock import SystemClock

        if not self.every or self.store.version() < self.next:
            return
        self.next = (self.store.version() // self.every + 1) * self.every
        maintain(
            self.store,
            clock=SystemClock(),
            sql_url=self.settings.sql_url,
            rescue_delay_seconds=self.settings.rescue_delay,
            storage_options=self.settings.storage_options,
            settings=self.settings,
            log_retention_seconds=self.settings.log_retention,
        )
        self.runs += 1


def _summary(
    commits: list[tuple[float, float, float]],
    samples: list[dict[str, Any]],
    *,
    elapsed: float,
    minutes: float,
    window_min: float,
) -> dict[str, Any]:
    first = _window_p50(commits, 0, window_min * 60)
    last = _window_p50(commits, elapsed - window_min * 60, elapsed + 1)
    checkpoints = [s["checkpoint"] for s in samples if s.get("checkpoint", {}).get("bytes")]
    half = checkpoints[len(checkpoints) // 2 :] or checkpoints
    return {
        "window_minutes": window_min,
        "first_window_commit_p50_ms": first,
        "last_window_commit_p50_ms": last,
        "last_over_first": round(last / first, 3) if first and last else None,
        "per_minute": _per_minute(commits, max(int(minutes), 1)),
        "checkpoint_bytes_second_half": (
            [min(c["bytes"] for c in half), max(c["bytes"] for c in half)] if half else None
        ),
        "checkpoint_txn_rows_max": max((c.get("txn", 0) for c in checkpoints), default=0),
        "samples": samples,
        "end": samples[-1],
    }


def run_writer(
    settings: Any,
    *,
    minutes: float,
    sample_s: float,
    window_min: float,
    rescuer: bool,
    maintain_every: int | None,
    workspace: Path,
    units: int | None = None,
) -> dict[str, Any]:
    """The run the module docstring describes, on the table ``settings`` name (already built).

    ``units``: that many units of work instead of ``minutes`` of them (a smoke run: every step
    once, however long a unit takes on a loaded machine)."""
    from outbox.app.facade import Outbox

    ctx = mp.get_context("spawn")
    stop, consumed = ctx.Event(), ctx.Value("q", 0)
    consumer = ctx.Process(target=_consume, args=(settings.sql_url, stop, consumed))
    ob = Outbox.open(settings=settings, transport="sql")
    consumer.start()
    rescue = _rescuer(workspace, workspace / "rescuer.log") if rescuer else None
    store = ob.store
    upkeep = _Upkeep(store, settings, maintain_every)
    commits: list[tuple[float, float, float]] = []
    real_save = store.save
    start = time.monotonic()

    def timed_save(writes: Any) -> int:
        t0 = time.monotonic()
        try:
            return real_save(writes)
        finally:
            commits.append((t0 - start, time.monotonic() - t0, 0.0))

    store.save = timed_save  # type: ignore[method-assign]
    monitor = Monitor(settings.table_uri, dict(settings.storage_options), sample_s, start)
    monitor.extra = lambda: {"consumed": consumed.value}
    monitor.take()
    monitor.start()
    done = 0
    try:
        while (done < units) if units is not None else (time.monotonic() - start < minutes * 60):
            t0 = time.monotonic()
            with ob.unit_of_work() as uow:
                for i in range(DOCS_PER_UNIT):
                    doc = uow.create(f"dev-{uuid.uuid4().hex}", type="Device", state={"n": i})
                    doc.send("Created", {"n": i})
            commits[-1] = (*commits[-1][:2], time.monotonic() - t0)
            done += 1
            upkeep()
    finally:
        elapsed = time.monotonic() - start
        monitor.stopped.set()
        monitor.join()
        retries = store.commit_retries
        ob.close()
        if rescue is not None:
            rescue.send_signal(signal.SIGTERM)
            rescue.wait(60)
        stop.set()
        consumer.join(300)
    monitor.take()
    sent = done * DOCS_PER_UNIT
    return {
        "minutes": minutes,
        "units": done,
        "documents_created": sent,
        "messages_consumed": consumed.value,
        "nothing_lost": consumed.value == sent,
        "commit_retries": retries,
        "maintain_runs": upkeep.runs,
        "commits_per_second": round(done / elapsed, 2),
        "rescuer_exit": None if rescue is None else rescue.returncode,
        **_summary(
            commits, monitor.samples, elapsed=elapsed, minutes=minutes, window_min=window_min
        ),
    }

"""The supervisor: start writers and workers, inject the plan's faults, run rescue passes, drain,
then verify.

Time: Delta commit timestamps are real wall time, and the rescuer compares them with its clock's
``now()``. The rescuer here runs on a clock that is ``rescue_delay - COMPRESSED_DELAY`` seconds
ahead of the wall clock, so a commit becomes old enough for the (real, 15 s minimum) delay after
about ``COMPRESSED_DELAY`` real seconds: the pass logic is exactly the product's, only the waiting
is skipped. Reported rescue latencies are real seconds; add the skipped seconds for the
latency a production rescuer with the same delay would show.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from outbox.checker.report import CheckReport, percentiles
from outbox.checker.scenario import Scenario
from outbox.core.clock import SystemClock
from outbox.core.errors import OutboxError

log = logging.getLogger("outbox.checker")

COMPRESSED_DELAY = 1.0  # real seconds between a commit and the rescuer seeing it as old enough
PASS_EVERY = 0.3
LOCK_DURATION = 5.0  # a SIGKILLed worker's commands come back after this long
MAX_WRITER_RESTARTS = 3  # a killed writer is restarted (without its crash point) this often

Progress = Callable[[str], None]


class OffsetClock(SystemClock):
    """The wall clock, ``offset`` seconds ahead (the rescuer's accelerated view of time)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.offset)


class InterruptedPass(Exception):
    """Stands for Ctrl-C or a crash in the middle of a rescue pass (after some enqueues)."""


class FlakySink:
    """Enqueues part of a pass's commands, then dies, with probability ``rate`` per pass."""

    def __init__(self, inner: Any, rng: random.Random, rate: float) -> None:
        self.inner, self.rng, self.rate = inner, rng, rate
        self.enqueued = 0

    def enqueue(self, commands: Sequence[Any]) -> int:
        if self.rate and self.rng.random() < self.rate:
            self.enqueued += self.inner.enqueue(commands[: len(commands) // 2])
            raise InterruptedPass("rescue pass interrupted after enqueueing half its commands")
        n = int(self.inner.enqueue(commands))
        self.enqueued += n
        return n


def run_rescue_pass(rescuer: Any, report: CheckReport) -> None:
    """One rescue pass, accounted for in ``report``.

    Only failures the product promises to survive are retried by the next pass (as cron or
    ``--every`` would): the checker's own injected interruption and an ``OutboxError`` (the queue
    is down, the feed is gone). Anything else (a raw driver error that escaped translation, a bug
    in the rescuer) is recorded in ``rescue_errors`` and fails the seed, so it cannot hide behind
    the retries.
    """
    report.rescue_passes += 1
    try:
        rescuer.run()
    except InterruptedPass:
        report.rescue_passes_interrupted += 1
    except OutboxError as e:
        report.rescue_passes_failed += 1
        log.warning("rescue pass failed (retried next pass): %s", e)
    except Exception as e:
        report.rescue_errors.append(f"{type(e).__name__}: {e}"[:500])
        log.error("rescue pass raised an unexpected %s: %s", type(e).__name__, e, exc_info=True)


@dataclass
class _Child:
    role: str
    index: int
    proc: Any
    cfg: dict[str, Any]
    generation: int = 0


def run_check(
    seed: int,
    workdir: str | Path,
    *,
    scale: float = 1.0,
    drain_timeout: float = 90.0,
    progress: Progress | None = None,
    keep: bool = False,
) -> CheckReport:
    """Run one seed end to end in ``workdir/seed-<seed>`` and return the verdict."""
    import multiprocessing

    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.app import Outbox
    from outbox.checker import procs
    from rescuer.checkpoint import SqlCheckpointStore
    from rescuer.engines import make_engine
    from rescuer.runner import RescuePass
    from rescuer.sink import QueueSink

    say = progress or (lambda _m: None)
    sc = Scenario.from_seed(seed, scale=scale)
    report = CheckReport(seed=seed, scenario=sc.describe())
    t_start = time.monotonic()
    root = Path(workdir) / f"seed-{seed}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    ws = root / "ws"
    overrides: dict[str, Any] = {
        "default_destination": procs.DESTINATION,
        "lock_duration": LOCK_DURATION,
        "compact_every": 20,
        # the truth is read from the whole change feed (version 0 on): nothing may be trimmed
        "log_retention": 30 * 24 * 3600,
    }
    setup = Outbox.open(ws, transport="memory", buckets=sc.buckets, **overrides)
    settings = setup.settings
    setup.close()
    say(sc.describe())

    ctx = multiprocessing.get_context("spawn")
    base: dict[str, Any] = {
        "workspace": str(ws),
        "log": str(root / "broker.log"),
        "outage_flag": str(root / "outage"),
        "failure_rate": sc.failure_rate,
        "latency_ms": sc.latency_ms,
        "settings": overrides,
    }

    def start(role: str, index: int, cfg: dict[str, Any]) -> Any:
        target = procs.writer_main if role == "writer" else procs.worker_main
        p = ctx.Process(target=target, args=(cfg,), name=f"checker-{role}-{index}", daemon=True)
        p.start()
        return p

    writers: list[_Child] = []
    for w in sc.writers:
        cfg = {
            **base,
            "index": w.index,
            "seed": w.seed,
            "rounds": w.rounds,
            "start": 0,
            "crash": w.crash,
            "pool": sc.pool,
            "private_share": sc.private_share,
            "docs_per_round": sc.docs_per_round,
            "msgs_per_doc": sc.msgs_per_doc,
            "journal": str(root / f"writer-{w.index}.jsonl"),
            "stderr": str(root / f"writer-{w.index}.log"),
        }
        writers.append(_Child("writer", w.index, start("writer", w.index, cfg), cfg))
    workers: list[_Child] = []
    for k in sc.workers:
        cfg = {**base, "index": k.index, "seed": k.seed, "crash": k.crash}
        cfg["stderr"] = str(root / f"worker-{k.index}.log")
        workers.append(_Child("worker", k.index, start("worker", k.index, cfg), cfg))

    rng = random.Random(seed ^ 0x5EED)
    queue = SqlQueue.from_settings(settings, clock=SystemClock())
    sink = FlakySink(QueueSink(queue, settings.command_queue), rng, sc.rescue_failure_rate)
    checkpoints = SqlCheckpointStore(settings.sql_url)
    offset = settings.rescue_delay - COMPRESSED_DELAY
    from outbox.delta.store import DeltaDocumentStore

    store = DeltaDocumentStore(settings.table_uri, storage_options=settings.storage_options)
    rescuer = RescuePass(
        store,
        make_engine("local"),
        checkpoints,
        sink,
        clock=OffsetClock(offset),
        delay=settings.rescue_delay,
    )
    report.rescue_delay_simulated_s = settings.rescue_delay
    report.rescue_delay_real_s = COMPRESSED_DELAY
    outage_flag = Path(str(base["outage_flag"]))
    kills = list(sc.kills)
    crashes: dict[str, int] = {}

    def note(what: str) -> None:
        crashes[what] = crashes.get(what, 0) + 1

    def rescue_pass() -> None:
        run_rescue_pass(rescuer, report)

    def reap(children: list[_Child], restart_writers: bool) -> None:
        for c in children:
            if c.proc.is_alive() or c.proc.exitcode is None:
                continue
            code = c.proc.exitcode
            if code == 0 and c.role == "writer":
                continue
            if getattr(c, "_reaped", False):
                continue
            note(f"{c.role} exit {'SIGKILL' if code == -signal.SIGKILL else code}")
            c._reaped = True  # type: ignore[attr-defined]
            if c.role == "worker":
                cfg = {**c.cfg, "crash": "", "seed": c.cfg["seed"] + 1}
                c.proc, c.cfg, c.generation = start("worker", c.index, cfg), cfg, c.generation + 1
                c._reaped = False  # type: ignore[attr-defined]
            elif restart_writers and c.generation < MAX_WRITER_RESTARTS:
                done = {e["round"] for e in procs.read_journal(c.cfg["journal"]) if "round" in e}
                cfg = {**c.cfg, "crash": "", "start": len(done)}
                c.proc, c.cfg, c.generation = start("writer", c.index, cfg), cfg, c.generation + 1
                c._reaped = False  # type: ignore[attr-defined]

    # --- the write phase, under faults ----------------------------------------------------------
    t0 = time.monotonic()
    while any(w.proc.is_alive() for w in writers) or any(
        w.proc.exitcode not in (0, None) and w.generation < MAX_WRITER_RESTARTS for w in writers
    ):
        t = time.monotonic() - t0
        down = any(o.at <= t < o.at + o.seconds for o in sc.outages)
        if down and not outage_flag.exists():
            outage_flag.touch()
            report.outages += 1
            say(f"broker outage at {t:.1f}s")
        elif not down and outage_flag.exists():
            outage_flag.unlink()
        while kills and kills[0].at <= t:
            kill = kills.pop(0)
            group = writers if kill.role == "writer" else workers
            victim = group[kill.index]
            if victim.proc.is_alive() and victim.proc.pid:
                os.kill(victim.proc.pid, signal.SIGKILL)
                report.sigkills_sent += 1
                say(f"SIGKILL {kill.role} {kill.index} (pid {victim.proc.pid}) at {t:.1f}s")
        reap(writers, restart_writers=True)
        reap(workers, restart_writers=False)
        rescue_pass()
        time.sleep(PASS_EVERY)
        if t > 300:  # pragma: no cover - a writer hung: fail loudly rather than forever
            raise RuntimeError(f"seed {seed}: writers still running after 300 s")
    if outage_flag.exists():
        outage_flag.unlink()
    say(f"writers done after {time.monotonic() - t0:.1f}s; draining")

    # --- drain: the broker is back; rescuer and workers finish the job ---------------------------
    deadline = time.monotonic() + drain_timeout
    quiet = 0
    while time.monotonic() < deadline:
        reap(workers, restart_writers=False)
        rescue_pass()
        pending = store.scan_pending(columns=["id"]).num_rows
        stats = queue.stats().get(settings.command_queue)
        in_queue = stats.total if stats is not None else 0
        dead = stats.dead_lettered if stats is not None else 0
        if pending == 0 and in_queue == 0:
            quiet += 1
            if quiet >= 2:
                report.drained = True
                break
        else:
            quiet = 0
        if pending and not in_queue and dead:
            report.dead_lettered += queue.requeue(all=True)  # as an operator would
        time.sleep(PASS_EVERY)
    for c in workers:
        if c.proc.is_alive():
            c.proc.terminate()
    for c in workers + writers:
        c.proc.join(10)
        if c.proc.is_alive():  # pragma: no cover
            c.proc.kill()
            c.proc.join(5)

    # --- verify ---------------------------------------------------------------------------------
    _verify(report, store, root, writers, crashes, sink, offset)
    report.duration_s = round(time.monotonic() - t_start, 2)
    queue.close()
    checkpoints.close()
    store.close()
    if report.ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    say(report.summary())
    return report


def _verify(
    report: CheckReport,
    store: Any,
    root: Path,
    writers: list[_Child],
    crashes: dict[str, int],
    sink: FlakySink,
    offset: float,
) -> None:
    from dispatcher.invariants import verify_deliveries
    from outbox.checker import procs
    from outbox.checker.broker import read_log
    from outbox.checker.truth import read_truth

    store.refresh()
    truth = read_truth(store.delta_table)
    deliveries = read_log(root / "broker.log")
    inv = verify_deliveries(truth.committed, [d.message for d in deliveries])
    report.documents = len(truth.committed)
    report.committed = inv.committed
    report.delta_versions = truth.versions
    report.deliveries = inv.delivered
    report.duplicates = inv.duplicates
    report.lost, report.out_of_order = inv.lost, inv.out_of_order
    report.phantoms, report.mismatched = inv.phantoms, inv.mismatched
    report.watermark_regressions = truth.watermark_regressions
    report.seq_gaps = truth.seq_gaps + truth.changed_content
    report.rescue_commands = sink.enqueued
    first: dict[str, Any] = {}
    for d in deliveries:
        first.setdefault(d.message.message_id, d)
    immediate: list[float] = []
    rescued: list[float] = []
    for mid, d in first.items():
        at = truth.committed_at.get(mid)
        if at is None:
            continue
        (immediate if d.role == "writer" else rescued).append(max(0.0, d.at - at))
    report.first_by_immediate, report.first_by_worker = len(immediate), len(rescued)
    report.latency_immediate = percentiles(immediate)
    report.latency_rescued = percentiles(rescued)
    ids = list(truth.committed)
    _, rows = store.read(ids) if ids else (0, {})
    report.not_dispatched = [
        f"{i}: dispatched_seq {r.dispatched_seq} < last_seq {r.last_seq}"
        for i, r in rows.items()
        if r.dispatched_seq < r.last_seq
    ]
    for w in writers:
        for e in procs.read_journal(w.cfg["journal"]):
            if e.get("event") != "round":
                continue
            report.saves += 1 if e.get("saved") else 0
            report.occ_retries += int(e.get("occ_retries", 0))
            report.commit_retries += int(e.get("commit_retries", 0))
            if e.get("crash"):
                crashes[f"writer raise at {e['crash']}"] = (
                    crashes.get(f"writer raise at {e['crash']}", 0) + 1
                )
            if not e.get("saved"):
                report.saves_failed.append(f"{e.get('error')}: {e.get('message')}")
    report.crashes = dict(sorted(crashes.items()))
    report.invariants = {
        "I1 no loss": not report.lost and not report.not_dispatched and not truth.seq_gaps,
        "I2 order": not report.out_of_order,
        "I3 no phantom": not report.phantoms,
        "I4 no interference": not report.saves_failed and not report.watermark_regressions,
        "I6 idempotence": not report.mismatched and not truth.changed_content,
    }

"""One seed end to end, in four named steps: **plan** (``Scenario.from_seed``), **run** (set up the
workspace, start the children, the write phase under faults, the drain: ``execute``), **reap**
(children that died are counted and restarted: ``reap``), **verify** (``verify``).

A *mutation* (``mutations``) runs the same seed against a deliberately broken build;
``OUTBOX_CHECK_MUTATION`` names one for ``outbox check``. The report must then fail.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict, Unpack

from outbox.app.checker import mutations
from outbox.app.checker.backends import SeedDatabase, check_engine, check_writer, seed_database
from outbox.app.checker.execute import Run, drain, worker_child, write_phase
from outbox.app.checker.reap import Child, Children, context
from outbox.app.checker.recreate import delete_and_recreate
from outbox.app.checker.report import CheckReport
from outbox.app.checker.rescue import (
    COMPRESSED_DELAY,
    FlakySink,
    InterruptedPass,
    OffsetClock,
    PassClock,
    RecordingQueue,
    run_rescue_pass,
)
from outbox.app.checker.scenario import Scenario, SparkPlan
from outbox.app.checker.tombstones import delete_through_the_library
from outbox.core.clock import SystemClock

__all__ = ["CheckOptions", "InterruptedPass", "OffsetClock", "run_check", "run_rescue_pass"]

LOCK_DURATION = 2.0  # a SIGKILLed worker's commands come back after this long
SPARK_READY_LIMIT = 600.0  # a Spark writer's JVM must be up by then (minutes on a loaded box)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CheckOptions:
    """How ``run_check`` runs a seed.

    ``scale`` multiplies the scenario's size; ``drain_timeout``: how long each drain may take;
    ``progress`` is told each step; ``keep``: keep a passing seed's workspace. ``mutation``: the
    name of a deliberately broken build (default: ``OUTBOX_CHECK_MUTATION``). ``sql``: ``sqlite``
    or a PostgreSQL URL (a database per seed on that server); ``engine``: the rescuer's engine,
    ``local`` or ``spark`` (``outbox.app.checker.backends``); ``writer``: ``python``, or
    ``spark`` for a Spark driver among the writers (``spark_writer``). ``table_root``: put the
    seed's table on an object store under this URI (``az://container``, ``s3://bucket``, a
    path of its own per seed), reached with ``storage_options``; default: the workspace's disk.
    """

    scale: float = 1.0
    drain_timeout: float = 90.0
    progress: Progress | None = None
    keep: bool = False
    mutation: str | None = None
    sql: str = "sqlite"
    engine: str = "local"
    writer: str = "python"
    table_root: str = ""
    storage_options: dict[str, str] = field(default_factory=dict)


class CheckKeywords(TypedDict, total=False):
    """``CheckOptions``' fields as ``run_check``'s keyword arguments."""

    scale: float
    drain_timeout: float
    progress: Progress | None
    keep: bool
    mutation: str | None
    sql: str
    engine: str
    writer: str
    table_root: str
    storage_options: dict[str, str]


def run_check(
    seed: int,
    workdir: str | Path,
    *,
    options: CheckOptions | None = None,
    **keywords: Unpack[CheckKeywords],
) -> CheckReport:
    """Run one seed end to end in ``workdir/seed-<seed>`` and return the verdict.

    ``options`` (``CheckOptions``), and any of its fields as a keyword over it.
    """
    opts = replace(options or CheckOptions(), **keywords)
    mutation = os.environ.get(mutations.ENV_VAR, "") if opts.mutation is None else opts.mutation
    broken = mutations.get(mutation)
    say = opts.progress or (lambda _m: None)
    sc = Scenario.from_seed(seed, scale=opts.scale, writer=check_writer(opts.writer))
    report = CheckReport(seed=seed, scenario=sc.describe(), mutation=mutation)
    report.engine = check_engine(opts.engine)
    report.writer = opts.writer
    t_start = time.monotonic()
    root = Path(workdir) / f"seed-{seed}"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    say(sc.describe() + (f"; MUTATION {mutation}" if mutation else ""))
    db = seed_database(opts.sql, seed)
    report.sql = db.backend
    run, recording, close = _prepare(
        sc, report, root, mutation=mutation, broken=broken, say=say, db=db, table=_table(opts, seed)
    )
    rescue_mutation = contextlib.ExitStack()
    try:
        if broken:  # a broken production rescuer (its pass, sink or planner), for this seed only
            rescue_mutation.enter_context(broken.supervisor_rescue())
        python_writers = [w for w in run.children.writers if not w.cfg.get("spark")]
        for child in run.children.writers:
            if child.cfg.get("spark"):  # its JVM first: its MERGE must meet the writers
                run.children.start(child)
                _await_ready(run, child)
        for child in python_writers + run.children.workers[:1]:
            run.children.start(child)
        write_phase(run)
        # a broken build's drain ends once it is stuck (its loss is final); the intact build's
        # runs to its end, where nothing is pending, or times out
        until_stuck = broken is not None
        drain(run, opts.drain_timeout, until_stuck=until_stuck)
        drained = run.report.drained
        # whether or not the drain finished: the step must fire (it waits for its document)
        delete_and_recreate(run, broken, wait=opts.drain_timeout)
        delete_through_the_library(run, broken, wait=opts.drain_timeout)
        if drained:  # a seed whose first drain timed out has failed; no second timeout to wait
            drain(run, opts.drain_timeout, until_stuck=until_stuck)
        run.children.stop()
        from outbox.app.checker.verify import verify

        verify(run, root, recording.first_command_at)
        _spark_counts(run)
    finally:
        rescue_mutation.close()
        close()
    report.duration_s = round(time.monotonic() - t_start, 2)
    if report.ok and not opts.keep:
        shutil.rmtree(root, ignore_errors=True)
        db.drop()
    say(report.summary())
    return report


def _table(opts: CheckOptions, seed: int) -> dict[str, Any]:
    """The settings that put the seed's table on an object store (none: the workspace's disk)."""
    if not opts.table_root:
        return {}
    where = f"{opts.table_root.rstrip('/')}/check-{seed}-{uuid.uuid4().hex[:8]}/documents"
    return {"table_uri": where, "storage_options": dict(opts.storage_options)}


def _await_ready(run: Run, child: Child) -> None:
    """Wait (on its journal, with a deadline) until the Spark writer starts its first MERGE."""
    deadline = time.monotonic() + SPARK_READY_LIMIT
    while time.monotonic() < deadline:
        if any(e.get("event") == "merging" for e in child.journal()):
            run.say(f"Spark writer's first MERGE after {run.elapsed():.1f}s")
            return
        if not child.alive:
            if child.proc.exitcode == -signal.SIGKILL:  # a planned fault (or a mutation)
                return
            break
        time.sleep(0.1)
    log_tail = Path(child.cfg["stderr"]).read_text("utf-8")[-2000:] if child.cfg else ""
    raise RuntimeError(f"the Spark writer did not start (exit {child.proc.exitcode}): {log_tail}")


def _spark_counts(run: Run) -> None:
    for child in run.children.writers:
        if child.cfg.get("spark"):
            rounds = [e for e in child.journal() if e.get("event") == "round" and e.get("saved")]
            run.report.spark_batches = len({e["round"] for e in rounds})
            run.report.spark_commit_retries = sum(int(e.get("commit_retries", 0)) for e in rounds)


def _prepare(
    sc: Scenario,
    report: CheckReport,
    root: Path,
    *,
    mutation: str,
    broken: mutations.Mutation | None,
    say: Progress,
    db: SeedDatabase,
    table: dict[str, Any] | None = None,
) -> tuple[Run, RecordingQueue, Callable[[], None]]:
    """The workspace, the children's configurations, the rescuer and its sink.

    The rescuer is built as ``outbox rescue`` builds it (``outbox.app.rescue.open_rescuer``, from
    the backends the settings choose). The checker only wraps the sink's queue
    (``RecordingQueue``: what was accepted, and when), the sink in its injected mid-pass death
    (``FlakySink``), and the clock (``PassClock``: ahead of the wall clock, and every commit young
    to the first pass that sees it).
    """
    from outbox.app.facade import Outbox
    from outbox.app.rescue import open_rescuer
    from rescuer.sink import CommandSink, QueueSink

    overrides: dict[str, Any] = {
        "default_destination": "shipments",
        "lock_duration": LOCK_DURATION,
        "compact_every": 20,
        # the truth is read from the whole change feed (version 0 on): nothing may be trimmed
        "log_retention": 30 * 24 * 3600,
    }
    if db.url:
        overrides["sql_url"] = db.url
    overrides.update(table or {})
    setup = Outbox.open(root / "ws", transport="memory", buckets=sc.buckets, **overrides)
    settings = setup.settings
    setup.close()
    base = _base_config(sc, root, overrides, mutation)
    children = Children(context())
    children.writers = [_writer_child(w, base, sc, root) for w in sc.writers]
    if sc.spark is not None:
        children.writers.append(_spark_child(sc.spark, base, sc, root))
    children.workers = [worker_child(k.index, base, k.seed, k.crash, root) for k in sc.workers]
    for kill in sc.kills:
        (children.writers if kill.role == "writer" else children.workers)[
            kill.index
        ].kills_pending += 1
    for w in children.writers:
        w.cfg["await_kill"] = w.kills_pending > 0
    offset = settings.rescue_delay - COMPRESSED_DELAY
    clock = PassClock(offset)
    recordings: list[RecordingQueue] = []
    flaky: list[FlakySink] = []

    def wrap(production: QueueSink) -> CommandSink:
        production.queue = recording = RecordingQueue(production.queue)
        recordings.append(recording)
        inner = broken.wrap_sink(production) if broken else production
        flaky.append(FlakySink(inner, random.Random(sc.seed ^ 0x5EED), sc.rescue_failure_rate))
        return flaky[0]

    parts = open_rescuer(
        settings, engine=report.engine, clock=clock, queue_clock=SystemClock(), wrap_sink=wrap
    )
    recording, sink = recordings[0], flaky[0]
    queue = parts.backends.sql_queue  # the command queue: the drain and the re-create use it
    store = parts.store
    clock.watch(store)  # the store the rescuer refreshes before it reads the time
    rescuer: Any = parts.rescue_pass
    report.rescue_delay_simulated_s = settings.rescue_delay
    report.rescue_delay_real_s = COMPRESSED_DELAY
    run = Run(
        scenario=sc,
        report=report,
        children=children,
        rescuer=broken.wrap_rescuer(rescuer) if broken else rescuer,
        store=store,
        queue=queue,
        command_queue=settings.command_queue,
        outage_flag=Path(base["outage_flag"]),
        say=say,
        settings=settings,
        clock=clock,
    )

    def close() -> None:
        report.rescue_commands = sink.enqueued
        children.stop()
        parts.close()

    return run, recording, close


def _spark_child(plan: SparkPlan, base: dict[str, Any], sc: Scenario, root: Path) -> Child:
    cfg = {
        **base,
        "spark": True,
        "index": plan.index,
        "seed": plan.seed,
        "rounds": plan.rounds,
        "start": 0,
        "crash": plan.crash,
        "plan": [[list(p) for p in batch] for batch in plan.batches],
        "app_id": f"outbox-check-{sc.seed}",
        "journal": str(root / f"writer-{plan.index}.jsonl"),
        "stderr": str(root / f"writer-{plan.index}.log"),
        "await_kill": False,
    }
    return Child("writer", plan.index, cfg)


def _base_config(
    sc: Scenario, root: Path, overrides: dict[str, Any], mutation: str
) -> dict[str, Any]:
    return {
        "workspace": str(root / "ws"),
        "log": str(root / "broker.log"),
        "outage_flag": str(root / "outage"),
        "failure_rate": sc.failure_rate,
        "latency_ms": sc.latency_ms,
        "settings": overrides,
        "mutation": mutation,
    }


def _writer_child(w: Any, base: dict[str, Any], sc: Scenario, root: Path) -> Child:
    cfg = {
        **base,
        "index": w.index,
        "seed": w.seed,
        "rounds": w.rounds,
        "start": 0,
        "crash": w.crash,
        "stranded": list(w.stranded),
        "conflicted": list(w.conflicted),
        "deletes": [asdict(d) for d in w.deletes],
        "pool": sc.pool,
        "private_share": sc.private_share,
        "docs_per_round": sc.docs_per_round,
        "msgs_per_doc": sc.msgs_per_doc,
        "journal": str(root / f"writer-{w.index}.jsonl"),
        "stderr": str(root / f"writer-{w.index}.log"),
    }
    return Child("writer", w.index, cfg)

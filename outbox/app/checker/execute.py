"""Run one seed's plan: the write phase under faults, then the drain.

The supervisor loop ticks every ``TICK`` seconds (so a planned SIGKILL usually lands while its
victim is mid-round) and runs a rescue pass every ``PASS_EVERY`` seconds. Every planned fault
fires whatever the timing (a loaded machine, a slow fork server, a late tick):

- plan times count from the start of the write phase, not from before the fork server started;
- a writer is killed once its journal shows the planned round, and a writer with a kill still due
  waits for it when done instead of exiting (``procs.writer_main``);
- a writer whose crash point the planned rounds did not reach (an outage or the failure rate took
  its sends) runs make-up rounds until it fires; a crash point not fired is carried over to a
  restarted process (``reap``);
- a worker kill or an outage still due when the writers finish happens then; two kills due at once
  land on two processes (the second on the restarted one), never twice on one pid;
- a second worker starts only once the first worker's crash point fired (otherwise it could take
  every command and leave that crash point without a hit), or when nothing is left to do;
- the drain ends only when every planned kill has landed (or never can: a writer gone once the
  writers are done) and every worker has started.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.app.checker.reap import Child, Children
from outbox.app.checker.report import CheckReport
from outbox.app.checker.rescue import PassClock, run_rescue_pass
from outbox.app.checker.scenario import Kill, Scenario

log = logging.getLogger("outbox.app.checker")

TICK = 0.02
PASS_EVERY = 0.3
WRITE_PHASE_LIMIT = 900.0  # a Spark writer's batches (--writer spark) take minutes under load

Progress = Callable[[str], None]


@dataclass
class Run:
    """What the supervisor drives and counts while a seed runs."""

    scenario: Scenario
    report: CheckReport
    children: Children
    rescuer: Any
    store: Any  # outbox.delta.store.DeltaDocumentStore
    queue: Any  # dispatcher.queue.sql_queue.SqlQueue
    command_queue: str
    outage_flag: Path
    say: Progress
    kills_due: list[Kill] = field(default_factory=list)
    kills_fired: list[Kill] = field(default_factory=list)
    outages_done: int = 0
    t0: float = field(default_factory=time.monotonic)
    next_pass: float = 0.0
    settings: Any = None  # outbox.core.settings.Settings of the seed's workspace
    recreated: str | None = None  # the document deleted outside the library and created again
    kept_deleted: str | None = None  # deleted through the library by the supervisor, and kept so
    reborn: str | None = None  # deleted through the library by the supervisor, then a new life
    clock: PassClock | None = None  # the rescuer's: told what each completed pass saw
    last_pass: Any = None  # the newest pass's PassReport (None: it did not complete)
    drain_state: DrainState | None = None  # what the newest drain step saw
    pending_at: tuple[int, int] | None = None  # (version, documents pending at it)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def rescue(self) -> None:
        """One rescue pass, unless it could change nothing (``_nothing_to_rescue``); the clock
        learns the newest version a completed pass saw."""
        if self._nothing_to_rescue():
            return
        done = run_rescue_pass(self.rescuer, self.report)
        self.last_pass = done
        latest = getattr(done, "latest_version", None)
        if self.clock is not None and latest is not None:
            self.clock.saw(int(latest))

    def _nothing_to_rescue(self) -> bool:
        """True when a pass now would do nothing: the last pass completed with its checkpoint at
        the newest version it saw (no young tail left to age), and the table has no version
        since. Such a pass reads an empty window (``find_window_end`` stops at the checkpoint),
        plans and enqueues nothing and writes the same checkpoint back, whatever the clock
        says, so skipping it changes no outcome; a pass after a new commit, a young tail or a
        pass that did not complete still runs."""
        last = self.last_pass
        after = getattr(last, "checkpoint_after", None)
        latest = getattr(last, "latest_version", None)
        if after is None or latest is None or after < latest:
            return False
        try:
            return bool(self.store.refresh() == latest)
        except Exception:  # the pass meets it too, and accounts for it (run_rescue_pass)
            return False

    def stuck(self) -> bool:
        """Nothing can move any more: documents are pending, yet the command queue holds
        nothing (no dead letter either), no planned kill is due, and the rescuer's last pass
        completed with its checkpoint at the table's newest version, so it will never plan
        those documents again. With the writers done, no process has anything left to do:
        a drain from here can only wait out its timeout."""
        state = self.drain_state
        if state is None or state.pending <= 0 or state.in_queue or state.dead or self.kills_due:
            return False
        return self._nothing_to_rescue()

    def rescue_if_due(self) -> None:
        if time.monotonic() >= self.next_pass:
            self.rescue()
            self.next_pass = time.monotonic() + PASS_EVERY


def write_phase(run: Run) -> None:
    """Writers write under faults while workers and rescue passes run; returns when every writer
    finished (or used up its restarts)."""
    run.kills_due = list(run.scenario.kills)
    # Plan times count from here, once the children are started: starting the fork server
    # takes seconds, more under load, and must not eat the outages and kills planned early.
    run.t0 = time.monotonic()
    while run.children.writers_running():
        t = run.elapsed()
        _outages(run, t, writers_done=False)
        _kills(run, t, writers_done=False)
        _late_workers(run, idle=False)
        run.children.reap(restart_writers=True)
        run.rescue_if_due()
        time.sleep(TICK)
        if t > WRITE_PHASE_LIMIT:  # pragma: no cover - a writer hung: fail loudly, not forever
            raise RuntimeError(f"seed {run.scenario.seed}: writers still running after {t:.0f}s")
    _outages(run, run.elapsed(), writers_done=True)
    _kills(run, run.elapsed(), writers_done=True)
    run.say(f"writers done after {run.elapsed():.1f}s; draining")


def _outages(run: Run, t: float, *, writers_done: bool) -> None:
    """Switch the broker outage flag on and off; an outage still due at the end runs then."""
    plan = run.scenario.outages
    if writers_done:
        if run.outage_flag.exists():
            # the writers finished inside an outage: it still ends as planned (the CI run that
            # found this left the flag on, so the broker stayed down through the whole drain)
            now = next((o for o in plan if o.at <= t < o.at + o.seconds), None)
            if now is not None:
                time.sleep(now.at + now.seconds - t)
            run.outage_flag.unlink()
        for o in plan[run.outages_done :]:
            run.outage_flag.touch()
            run.report.outages += 1
            run.say(f"broker outage ({o.seconds}s) as the writers finish")
            time.sleep(o.seconds)  # the outage itself: every sender fails meanwhile
            run.outage_flag.unlink()
        run.outages_done = len(plan)
        return
    down = next((o for o in plan if o.at <= t < o.at + o.seconds), None)
    if down is not None and not run.outage_flag.exists():
        run.outage_flag.touch()
        run.report.outages += 1
        run.outages_done = max(run.outages_done, plan.index(down) + 1)
        run.say(f"broker outage at {t:.1f}s")
    elif down is None and run.outage_flag.exists():
        run.outage_flag.unlink()


def _kills(run: Run, t: float, *, writers_done: bool) -> None:
    """Send the planned SIGKILLs that are due. A kill needs a live victim that no earlier planned
    kill hit (two kills due at once land on two processes, the second on the restarted one).
    A writer with a kill still due waits for it when done, so it is alive whenever that is."""
    for kill in list(run.kills_due):
        group = run.children.writers if kill.role == "writer" else run.children.workers
        victim = group[kill.index]
        if kill.role == "writer" and writers_done and not victim.alive:
            # no writer is restarted once they are done: this kill can never land (the report
            # names it unfired), and the drain need not wait for it
            run.kills_due.remove(kill)
            continue
        if kill.role == "writer":
            due = victim.rounds_done() >= kill.after_round
        else:
            due = writers_done or kill.at <= t
        pid = victim.proc.pid if victim.proc is not None else None
        if due and victim.alive and pid and pid not in victim.killed_pids:
            os.kill(pid, signal.SIGKILL)
            victim.killed_pids.add(pid)
            victim.kills_pending -= 1
            run.report.sigkills_sent += 1
            run.kills_due.remove(kill)
            run.kills_fired.append(kill)
            run.say(f"{kill.describe()} (pid {pid}) at {t:.1f}s")


def _late_workers(run: Run, *, idle: bool) -> None:
    """Start worker k > 0 once every earlier worker's planned crash point has fired, or once
    there is nothing left to do (``idle``: no crash point can fire any more, and a kill planned
    for the late worker needs it alive). Starting it earlier could let it take every command
    and leave the first worker's crash point without a hit."""
    for k, w in enumerate(run.children.workers):
        if w.started:
            continue
        earlier = run.children.workers[:k]
        if idle or all(not e.cfg["crash"] or e.crash_fired() for e in earlier):
            run.children.start(w)


def drain(run: Run, timeout: float, *, until_stuck: bool = False) -> None:
    """The broker is back: rescue passes and workers finish the job, until nothing is pending,
    the command queue is empty twice in a row, every worker has started and every planned
    kill that still can has landed (or ``timeout``).

    ``until_stuck`` (a broken build's seed): give up as soon as two steps in a row find the
    seed stuck (``Run.stuck``: pending documents nothing will ever command), rather than wait
    out the timeout: the build is judged on what it broke, and from there the wait only spent
    the workers' polls and the rescuer's passes (8 s for each build that loses a message)."""
    deadline = time.monotonic() + timeout
    quiet = stuck = 0
    while time.monotonic() < deadline:
        quiet = quiet + 1 if drain_step(run) else 0
        if quiet >= 2:
            run.report.drained = True
            return
        stuck = stuck + 1 if until_stuck and run.stuck() else 0
        if stuck >= 2:
            run.say(f"stuck after {run.elapsed():.1f}s: pending documents nothing will command")
            return
        time.sleep(PASS_EVERY)


def _pending(run: Run) -> int:
    """How many documents are pending now. Counted again only when the table has a version
    since the last count: a count is a SQL scan of the whole table, and the drain steps every
    ``PASS_EVERY`` seconds; what is pending is a function of the version."""
    version = run.store.refresh()
    if run.pending_at is not None and run.pending_at[0] == version:
        return run.pending_at[1]
    count = int(run.store.scan_pending(columns=["id"]).num_rows)
    run.pending_at = (int(run.store.version()), count)
    return count


@dataclass(frozen=True)
class DrainState:
    """What a drain step saw: pending documents (-1: not counted, commands were in the queue),
    commands in the queue, dead letters."""

    pending: int
    in_queue: int
    dead: int


def drain_step(run: Run) -> bool:
    """One step of the drain: reap and restart, land the kills still due, one rescue pass, start
    late workers, requeue dead letters as an operator would. True when the seed is idle (nothing
    pending, the command queue empty) and settled (every kill landed, every worker started)."""
    run.children.reap(restart_writers=False)
    _kills(run, run.elapsed(), writers_done=True)
    run.rescue()
    stats = run.queue.stats().get(run.command_queue)
    in_queue = stats.total if stats is not None else 0
    dead = stats.dead_lettered if stats is not None else 0
    # with commands in the queue the step is neither idle nor stuck, whatever is pending
    pending = _pending(run) if not in_queue else -1
    run.drain_state = DrainState(pending, in_queue, dead)
    idle = pending == 0 and in_queue == 0
    _late_workers(run, idle=idle)
    if pending and not in_queue and dead:
        run.report.dead_lettered += run.queue.requeue(all=True)  # as an operator would
    return idle and not run.kills_due and all(w.started for w in run.children.workers)


def worker_child(index: int, base: dict[str, Any], seed: int, crash: str, root: Path) -> Child:
    cfg = {**base, "index": index, "seed": seed, "crash": crash}
    cfg["stderr"] = str(root / f"worker-{index}.log")
    cfg["journal"] = str(root / f"worker-{index}.jsonl")
    return Child("worker", index, cfg)

"""The supervisor's children: start writers and workers, notice when one died, restart it.

A dead worker is replaced at once (``run-dispatcher`` under a process manager); a dead writer is
restarted where its journal says it stopped, up to ``MAX_WRITER_RESTARTS`` times (an application
restarted by its orchestrator). A planned crash point that has not fired yet is carried over to
the new process, so a SIGKILL from outside cannot cancel a planned fault.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outbox.app.checker import procs, spark_writer

MAX_WRITER_RESTARTS = 3  # a killed writer is restarted (without a fired crash point) this often

#: Imported once by the fork server instead of once per child (about 2 s each on this machine).
#: The last four are imported lazily, by a child's first read or save (``pyarrow.compute``
#: imports pandas on its first kernel call): profiled, they were most of a writer's or a
#: worker's CPU (issue 43's suite time). Importing deltalake does not start its runtime (its
#: first use does), so the fork server's children still fork from a process that never used it.
PRELOAD = [
    "outbox.app.checker.procs",
    "outbox.app.facade",
    "dispatcher.worker",
    "outbox.testing.faulty",
    "deltalake",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "pandas",
]


def context() -> Any:
    """The fork server context every checker child comes from."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@dataclass
class Child:
    role: str  # "writer" or "worker"
    index: int
    cfg: dict[str, Any]
    proc: Any = None
    generation: int = 0
    reaped: bool = False  # its death was counted (and it was not restarted)
    started: bool = False
    planned_crash: str = ""  # the plan's crash point (cfg["crash"] is cleared once it fired)
    #: The supervisor's SIGKILLs still planned for this child; a writer with one waits for it
    #: when done (``cfg["await_kill"]``) instead of exiting.
    kills_pending: int = 0
    killed_pids: set[int] = field(default_factory=set)  # processes a planned SIGKILL already hit
    _journal: tuple[int, list[dict[str, Any]]] = field(default=(-1, []), repr=False)

    def __post_init__(self) -> None:
        self.planned_crash = self.planned_crash or self.cfg.get("crash", "")

    @property
    def alive(self) -> bool:
        return self.proc is not None and bool(self.proc.is_alive())

    def journal(self) -> list[dict[str, Any]]:
        """The child's journal (every process it ran appends to the same file), read again only
        when the file grew: journals are append-only, and the supervisor asks every tick."""
        try:
            size = os.stat(self.cfg["journal"]).st_size
        except FileNotFoundError:
            return []
        if size != self._journal[0]:
            self._journal = (size, procs.read_journal(self.cfg["journal"]))
        return self._journal[1]

    def rounds_done(self) -> int:
        return len({e["round"] for e in self.journal() if "round" in e})

    def crash_fired(self) -> bool:
        return any(e.get("event") == "fired" for e in self.journal())


@dataclass
class Children:
    """Every child of one seed, and what their deaths were."""

    ctx: Any
    writers: list[Child] = field(default_factory=list)
    workers: list[Child] = field(default_factory=list)
    deaths: dict[str, int] = field(default_factory=dict)  # "writer exit SIGKILL" -> count
    on_death: Callable[[str], None] | None = None

    def start(self, child: Child) -> None:
        target = procs.writer_main if child.role == "writer" else procs.worker_main
        if child.cfg.get("spark"):
            target = spark_writer.spark_writer_main
        child.proc = self.ctx.Process(
            target=procs.with_environment,
            args=(target, child.cfg, dict(os.environ)),
            name=f"checker-{child.role}-{child.index}",
            daemon=True,
        )
        child.proc.start()
        child.started, child.reaped = True, False

    def writers_running(self) -> bool:
        """A writer is alive, or dead early and due for a restart."""
        return any(
            w.alive or (w.proc.exitcode not in (0, None) and w.generation < MAX_WRITER_RESTARTS)
            for w in self.writers
        )

    def reap(self, *, restart_writers: bool) -> None:
        for c in self.writers + self.workers:
            if c.proc is None or c.alive or c.reaped or c.proc.exitcode is None:
                continue
            code = c.proc.exitcode
            if code == 0 and c.role == "writer":
                continue
            self._died(f"{c.role} exit {'SIGKILL' if code == -signal.SIGKILL else code}")
            c.reaped = True
            if c.role == "worker":
                self._restart(c, seed=c.cfg["seed"] + 1)
            elif restart_writers and c.generation < MAX_WRITER_RESTARTS:
                self._restart(c, start=c.rounds_done())

    def _restart(self, c: Child, **changes: Any) -> None:
        crash = "" if c.crash_fired() else c.cfg["crash"]
        c.cfg = {**c.cfg, **changes, "crash": crash}
        if c.role == "writer":
            c.cfg["await_kill"] = c.kills_pending > 0
        c.generation += 1
        self.start(c)

    def _died(self, what: str) -> None:
        self.deaths[what] = self.deaths.get(what, 0) + 1
        if self.on_death is not None:
            self.on_death(what)

    def stop(self) -> None:
        """SIGTERM the workers (they finish their batch), wait for everyone."""
        for c in self.workers:
            if c.alive:
                c.proc.terminate()
        for c in self.workers + self.writers:
            if c.proc is None:
                continue
            c.proc.join(10)
            if c.proc.is_alive():  # pragma: no cover
                c.proc.kill()
                c.proc.join(5)

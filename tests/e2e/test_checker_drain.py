"""The supervisor spends nothing where nothing can change: a rescue pass that would read an empty
window is skipped, a broken build's drain ends once it is stuck, the pending documents are
counted again only at a new version (``outbox.app.checker.execute``), and a child's journal is
read again only when it grew (``reap.Child``). On stand-ins for the store and the rescuer: what
is decided here is only whether a pass runs, whether a drain can still finish, and when a count
or a journal is read again; and on the production ``RescuePass``, what the skip relies on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from outbox.app.checker.execute import DrainState, Run, _pending
from outbox.app.checker.reap import Children
from outbox.app.checker.report import CheckReport
from outbox.app.checker.rescue import InterruptedPass
from outbox.app.checker.scenario import Kill, Scenario


@dataclass
class Done:
    """A completed pass's report: the fields the supervisor reads."""

    checkpoint_after: int | None
    latest_version: int


class Table:
    def __init__(self, version: int) -> None:
        self.at = version
        self.scans = 0
        self.pending: list[str] = []

    def refresh(self) -> int:
        return self.at

    def version(self) -> int:
        return self.at

    def scan_pending(self, columns: list[str]) -> pa.Table:
        self.scans += 1
        return pa.table({"id": pa.array(self.pending, pa.string())})


class Rescuer:
    def __init__(self, table: Table) -> None:
        self.table, self.runs = table, 0
        self.window_end: int | None = None  # None: up to the newest version
        self.interrupt = False

    def run(self) -> Done:
        self.runs += 1
        if self.interrupt:
            raise InterruptedPass("half")
        end = self.table.at if self.window_end is None else self.window_end
        return Done(checkpoint_after=end, latest_version=self.table.at)


def _run(tmp_path: Path, version: int = 5) -> tuple[Run, Table, Rescuer]:
    table = Table(version)
    rescuer = Rescuer(table)
    run = Run(
        scenario=Scenario.from_seed(1, scale=0.5),
        report=CheckReport(seed=1, scenario="unit"),
        children=Children(ctx=None),
        rescuer=rescuer,
        store=table,
        queue=None,
        command_queue="outbox-commands",
        outage_flag=tmp_path / "outage",
        say=lambda _m: None,
    )
    return run, table, rescuer


def test_a_pass_that_could_change_nothing_is_skipped(tmp_path: Path) -> None:
    run, table, rescuer = _run(tmp_path)
    run.rescue()
    run.rescue()  # the checkpoint is at the newest version and nothing was committed since
    assert (rescuer.runs, run.report.rescue_passes) == (1, 1)
    table.at = 6  # a commit: the next pass has a window to read
    run.rescue()
    assert rescuer.runs == 2


def test_a_young_tail_or_an_unfinished_pass_is_never_skipped(tmp_path: Path) -> None:
    run, _table, rescuer = _run(tmp_path)
    rescuer.window_end = 4  # version 5 was too young for the pass: it must age and be seen
    run.rescue()
    run.rescue()
    assert rescuer.runs == 2
    rescuer.window_end, rescuer.interrupt = None, True
    run.rescue()  # interrupted: its checkpoint did not move
    run.rescue()
    assert rescuer.runs == 4
    assert run.report.rescue_passes_interrupted == 2
    rescuer.interrupt = False
    run.rescue()
    run.rescue()
    assert rescuer.runs == 5


def test_a_drain_is_stuck_only_when_nothing_can_command_the_pending_documents(
    tmp_path: Path,
) -> None:
    run, table, rescuer = _run(tmp_path)
    run.rescue()
    run.drain_state = DrainState(pending=2, in_queue=0, dead=0)
    assert run.stuck()
    moving: list[Any] = [
        DrainState(pending=2, in_queue=1, dead=0),  # a worker has a command to run
        DrainState(pending=2, in_queue=0, dead=1),  # dead letters are requeued
        DrainState(pending=0, in_queue=0, dead=0),  # nothing pending: the drain finishes
    ]
    for state in moving:
        run.drain_state = state
        assert not run.stuck(), state
    run.drain_state = DrainState(pending=2, in_queue=0, dead=0)
    run.kills_due = [Kill(1.0, "worker", 0)]  # a kill still to land
    assert not run.stuck()
    run.kills_due = []
    table.at = 6  # a commit the rescuer has not seen
    assert not run.stuck()
    rescuer.window_end = 5  # its pass leaves version 6 young
    run.rescue()
    assert not run.stuck()
    rescuer.window_end = None
    run.rescue()
    assert run.stuck()


def test_the_pending_documents_are_counted_again_only_at_a_new_version(tmp_path: Path) -> None:
    run, table, _rescuer = _run(tmp_path)
    table.pending = ["pkg-1", "pkg-2"]
    assert (_pending(run), _pending(run)) == (2, 2)
    assert table.scans == 1  # the same version: the same documents are pending
    table.at, table.pending = 6, ["pkg-2"]
    assert _pending(run) == 1
    assert table.scans == 2


def test_a_journal_is_read_again_only_when_it_grew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.app.checker import procs
    from outbox.app.checker.reap import Child

    reads: list[str] = []
    real = procs.read_journal
    monkeypatch.setattr(procs, "read_journal", lambda p: reads.append(p) or real(p))
    path = tmp_path / "writer-0.jsonl"
    child = Child("writer", 0, {"journal": str(path)})
    assert child.journal() == []  # not written yet
    path.write_text('{"event": "round", "round": 0}\n')
    assert child.rounds_done() == 1
    assert not child.crash_fired()
    assert len(reads) == 1
    with path.open("a") as f:  # a restarted process appends to the same journal
        f.write('{"event": "fired", "point": "after_send"}\n')
    assert child.crash_fired()
    assert len(reads) == 2


def test_a_pass_with_no_new_version_does_nothing_however_late_it_runs(tmp_path: Path) -> None:
    """What the skip relies on, on the production ``RescuePass``: once a pass's checkpoint is at
    the newest version, a pass with no version since enqueues nothing and keeps the checkpoint,
    whatever its clock says, even with a document still pending (commanded once, never sent)."""
    from outbox.core.clock import ManualClock
    from outbox.testing.tables import Table
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import InMemoryCheckpointStore
    from rescuer.runner import RescuePass
    from rescuer.sink import InMemorySink

    delay = 15.0
    table = Table(tmp_path / "documents")
    table.put(("base", 1))
    table.dispatch(base=1)
    v = table.put(("stranded", 1))
    wall = ManualClock(table.at(v, delay))
    sink = InMemorySink()
    rescuer = RescuePass(
        table.store, LocalEngine(), InMemoryCheckpointStore(), sink, clock=wall, delay=delay
    )
    first = rescuer.run()
    assert (first.checkpoint_after, first.latest_version) == (v, v)
    assert [c.id for c in sink.commands] == ["stranded"]
    for later in (1.0, 3600.0):
        wall.set(table.at(v, delay + later))
        again = rescuer.run()
        assert (again.commands_enqueued, again.checkpoint_after, again.latest_version) == (0, v, v)
    assert [c.id for c in sink.commands] == ["stranded"]  # still pending, never planned again

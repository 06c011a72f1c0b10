"""The rescuer's clock in the checker (``PassClock``): every commit is young to the first pass that
sees it, however late that pass runs.

Why it matters: the ``rescue-checkpoint-past-window`` build only loses a commit that a pass sees
young. On the wall clock alone a pass must start within ``COMPRESSED_DELAY`` real seconds of the
commit; on a loaded machine passes started up to 1.6 s apart (issue 42), and the broken build
would then rescue the commit like the intact one. These tests run the production ``RescuePass``
with a wall clock set 10 s after the commit (a pass that ran that late), no sleeping.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

from outbox.app.checker.mutations import MUTATIONS
from outbox.app.checker.rescue import COMPRESSED_DELAY, FIRST_SIGHT, PassClock
from outbox.core.clock import ManualClock
from outbox.testing.tables import Table
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink

DELAY = 15.0
LATE = 10.0  # the pass runs this many seconds after the commit


def test_the_clock_is_capped_until_a_completed_pass_saw_the_commit(tmp_path: Path) -> None:
    table = Table(tmp_path / "documents")
    before = table.put(("a", 1))
    v = table.put(("b", 1))
    wall = ManualClock(table.at(v, LATE))
    clock = PassClock(0.0, wall=wall)
    assert clock.now() == wall.now()  # no store watched: the wall clock (plus the offset)
    clock.watch(table.store)
    clock.saw(before)
    assert clock.now() == table.at(v, FIRST_SIGHT)
    clock.saw(v)  # a pass saw it: the wall clock again
    assert clock.now() == wall.now()
    assert PassClock(7.0, wall=wall).now() == wall.now() + timedelta(seconds=7.0)  # the offset


def _two_passes(tmp_path: Path, *, capped: bool, mutation: str) -> InMemorySink:
    """A baseline pass, a stranded commit, then two passes (the first 10 s late, the second
    later still): what the sink got."""
    table = Table(tmp_path / "documents")
    table.put(("base", 1))
    table.dispatch(base=1)
    wall = ManualClock(table.at(table.store.refresh(), DELAY))
    clock = PassClock(DELAY - COMPRESSED_DELAY, wall=wall)
    if capped:
        clock.watch(table.store)
    sink = InMemorySink()
    rescuer = RescuePass(
        table.store, LocalEngine(), InMemoryCheckpointStore(), sink, clock=clock, delay=DELAY
    )
    broken: AbstractContextManager[Any] = (
        MUTATIONS[mutation].supervisor_rescue() if mutation else nullcontext()
    )
    with broken:
        clock.saw(rescuer.run().latest_version)
        stranded = table.put(("stranded", 1))
        wall.set(table.at(stranded, LATE))
        clock.saw(rescuer.run().latest_version)
        wall.set(table.at(stranded, 2 * LATE))
        clock.saw(rescuer.run().latest_version)
    return sink


def test_a_late_pass_still_sees_the_newest_commit_young(tmp_path: Path) -> None:
    intact = _two_passes(tmp_path / "intact", capped=True, mutation="")
    assert [(c.id, c.up_to_seq) for c in intact.commands] == [("stranded", 1)]
    broken = _two_passes(tmp_path / "broken", capped=True, mutation="rescue-checkpoint-past-window")
    assert broken.commands == []  # the first pass skipped it as young: lost, whatever the timing


def test_without_the_cap_a_late_pass_hides_the_broken_window(tmp_path: Path) -> None:
    """What the cap is for: on the wall clock alone, a pass 10 s late sees the commit old, and
    the broken build rescues it like the intact one."""
    broken = _two_passes(tmp_path, capped=False, mutation="rescue-checkpoint-past-window")
    assert [(c.id, c.up_to_seq) for c in broken.commands] == [("stranded", 1)]

"""A program that ends with an exception and an open ``Outbox`` (issue 42, item 6).

It crashed at interpreter exit now and then under load ("Fatal Python error: Segmentation fault",
exit 139): the outbox's daemon threads were still inside native code while the interpreter
finalized. The outbox is now closed when the interpreter starts to shut down
(``outbox.core.shutdown``), so by the time ``atexit`` handlers run (after threading's shutdown,
before finalization) none of its threads is alive, and its pending watermarks were written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from outbox.app.facade import Outbox

PROGRAM = """
import atexit, sys, threading
from pathlib import Path

ws, report, mutation = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if mutation:
    from tests.mutate import apply
    apply(mutation)


def check() -> None:  # atexit: after threading's shutdown, before the interpreter finalizes
    alive = [t.name for t in threading.enumerate() if t.name.startswith("outbox-")]
    report.write_text(",".join(sorted(alive)))


atexit.register(check)
from outbox.app.facade import Outbox

ob = Outbox.open(ws, transport="memory", watermark_window=5.0)
with ob.unit_of_work() as uow:
    uow.create("a", type="T").send("E", {}, destination="q")
raise RuntimeError("the program fails with its outbox open")
"""


def _end_a_program(tmp_path: Path, mutation: str = "") -> tuple[str, str]:
    ws, report = tmp_path / "ws", tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(ws), str(report), mutation],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1, done.stderr  # the exception's exit, not a signal
    assert "RuntimeError: the program fails with its outbox open" in done.stderr
    with Outbox.open(ws, create=False, transport="memory") as ob:
        pending = ob.store.scan_pending().num_rows
    return report.read_text(), "pending" if pending else "marked"


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_an_outbox_left_open_is_closed_before_the_interpreter_shuts_down(tmp_path: Path) -> None:
    alive, watermark = _end_a_program(tmp_path)
    assert alive == ""  # no outbox thread outlived threading's shutdown
    assert watermark == "marked"  # the writer's last marks were written on the way out


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_without_the_exit_hook_its_threads_outlive_shutdown(tmp_path: Path) -> None:
    """The mutation: nothing closes the outbox at exit."""
    alive, _ = _end_a_program(tmp_path, "nothing-closed-at-exit")
    assert "outbox-watermarks" in alive


THREADS = """
import sys, threading
from pathlib import Path

report, mutation = Path(sys.argv[1]), sys.argv[2]
if mutation:
    from tests.mutate import apply
    apply(mutation)
from outbox.core.shutdown import close_at_exit

returned, closed, done = threading.Event(), threading.Event(), threading.Event()


class Part:  # stands for an Outbox: what does its close find?
    def close(self) -> None:
        closed.set()
        report.write_text("thread done" if done.is_set() else "closed under the thread")


def work() -> None:  # the program's own thread, still working after main returned
    returned.wait()
    closed.wait(2.0)  # a close that comes first ends this wait: it is recorded, not raced
    done.set()


part = Part()  # remembered weakly, as an Outbox is: the program holds it
close_at_exit(part)
threading.Thread(target=work, name="app-worker").start()
returned.set()  # the main thread's last statement
"""


def _end_with_a_thread(tmp_path: Path, mutation: str = "") -> str:
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-c", THREADS, str(report), mutation],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return report.read_text()


def test_the_programs_own_threads_finish_before_the_outbox_is_closed(tmp_path: Path) -> None:
    """A main thread that returns while the program's threads still commit: they finish
    first (with the hook closing at once, their commits failed with ``ClosedError``)."""
    assert _end_with_a_thread(tmp_path) == "thread done"


def test_without_joining_them_the_outbox_closes_under_them(tmp_path: Path) -> None:
    """The mutation: the hook closes without joining the program's threads."""
    assert _end_with_a_thread(tmp_path, "exit-hook-joins-nothing") == "closed under the thread"

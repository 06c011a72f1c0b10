"""The frame every ``outbox demo`` story is told in: its workspace and wall time, its narration,
its report's verdict and JSON, and the summary table's closing rows.

Why one frame: the stories (shipments, geo, devices) differ in what happens, not in how a run is
set up, judged and told; ``outbox.app.cli.demo`` prints every report the same way through it.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

#: Says one step of the story (the CLI's ``> ...`` line, or a log line under ``--json``).
Step = Callable[[str], None]
#: ``with bar(description, total) as advance: advance(n)``: a long step's progress.
Bar = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


@dataclass
class StoryReport:
    """What every story's report holds besides its own fields. The shared fields after the
    first two are keyword-only, so a story's own fields keep their places after ``kept``."""

    workspace: str
    kept: bool
    duration_s: float = field(default=0.0, kw_only=True)
    invariants: dict[str, bool] = field(default_factory=dict, kw_only=True)
    problems: list[str] = field(default_factory=list, kw_only=True)

    @property
    def ok(self) -> bool:
        return bool(self.invariants) and all(self.invariants.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


R = TypeVar("R", bound=StoryReport)


@contextmanager
def story_workspace(
    workspace: str | Path | None, prefix: str, report_type: type[R], **fields: Any
) -> Iterator[tuple[Path, R]]:
    """The story's folder and its report (``report_type(workspace=..., kept=..., **fields)``):
    ``workspace``, or a temporary folder removed afterwards when None; the report's wall time is
    set on the way out, however the story ended (Ctrl-C included: the story stops its children
    and threads first, see ``cleanup``, and a second Ctrl-C does not cut the removal short)."""
    t_start = time.monotonic()
    temp = workspace is None
    ws: Path | None = None
    try:
        ws = Path(tempfile.mkdtemp(prefix=prefix)) if temp else Path(str(workspace))
        report = report_type(workspace=str(ws), kept=not temp, **fields)
        try:
            yield ws, report
        finally:
            report.duration_s = round(time.monotonic() - t_start, 1)
    finally:
        if temp and ws is not None:
            with _no_interrupts():
                shutil.rmtree(ws, ignore_errors=True)


@contextmanager
def cleanup() -> Iterator[ExitStack]:
    """A stack of what a story started (a child process, threads, open stores), undone in reverse
    before the frame removes the folder, so nothing is left running or writing into it.

    When the story is already failing (Ctrl-C above all) the undoing is quiet: its own errors
    (a store closed mid-commit) are dropped, because the first failure is the one to report and
    the exit code must stay the interrupt's (130). On a clean end its errors are raised."""
    stack = ExitStack()
    try:
        yield stack
    except BaseException:
        with suppress(Exception):
            stack.close()
        raise
    stack.close()


@contextmanager
def _no_interrupts() -> Iterator[None]:
    """Ctrl-C ignored within the block (on the main thread: only there can Python set a handler),
    for the short steps that must not be cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def closing_rows(
    report: StoryReport, not_exercised: Mapping[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """How every summary table ends: each invariant's verdict, then the wall time. An invariant
    in ``not_exercised`` held only vacuously; its row says why instead of "held"."""
    for name, held in report.invariants.items():
        why = (not_exercised or {}).get(name)
        yield name, ("BROKEN" if not held else f"not exercised: {why}" if why else "held")
    yield "wall time", f"{report.duration_s:.1f}s"

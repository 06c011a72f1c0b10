"""The supervisor's planned SIGKILLs once the writers are done: a writer kill that can no longer
land (no writer is restarted then) is dropped, so the drain does not wait its whole timeout for it,
and the report still names it unfired. Found with the broken build whose writers die at start
(issue 42): every drain of its seed ran to the timeout."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from outbox.app.checker.execute import _kills
from outbox.app.checker.reap import Child
from outbox.app.checker.scenario import Kill


def _run(tmp_path: Path, kill: Kill) -> SimpleNamespace:
    writer = Child("writer", 0, {"journal": str(tmp_path / "writer-0.jsonl"), "crash": ""})
    return SimpleNamespace(
        children=SimpleNamespace(writers=[writer], workers=[]),
        kills_due=[kill],
        kills_fired=[],
        report=SimpleNamespace(sigkills_sent=0),
        say=lambda _line: None,
    )


def test_a_writer_kill_that_can_no_longer_land_is_dropped_when_the_writers_are_done(
    tmp_path: Path,
) -> None:
    kill = Kill(0.0, "writer", 0, after_round=1)
    run = _run(tmp_path, kill)
    _kills(run, 1.0, writers_done=False)  # type: ignore[arg-type]
    assert run.kills_due == [kill]  # the writer may still be restarted and reach its round
    _kills(run, 1.0, writers_done=True)  # type: ignore[arg-type]
    assert run.kills_due == []
    assert run.kills_fired == []  # unfired: the report says so
    assert run.report.sigkills_sent == 0

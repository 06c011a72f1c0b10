"""The supervisor's outage switch: an outage the writers finish inside still ends on time.

Found by a CI run: the writers of PostgreSQL seed 3 finished while the broker was down, the flag
stayed on, every send failed through the whole drain and the seed was reported undrained.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from outbox.app.checker.execute import _outages
from outbox.app.checker.scenario import Outage


def _run(tmp_path: Path, *outages: Outage) -> SimpleNamespace:
    return SimpleNamespace(
        scenario=SimpleNamespace(outages=list(outages)),
        outages_done=0,
        outage_flag=tmp_path / "outage",
        report=SimpleNamespace(outages=0),
        say=lambda _line: None,
    )


def test_an_outage_the_writers_finish_inside_is_switched_off(tmp_path: Path) -> None:
    run = _run(tmp_path, Outage(at=0.0, seconds=0.02))
    _outages(run, 0.0, writers_done=False)  # type: ignore[arg-type]
    assert run.outage_flag.exists()
    assert run.report.outages == 1
    _outages(run, 0.01, writers_done=True)  # type: ignore[arg-type]
    assert not run.outage_flag.exists()
    assert run.report.outages == 1  # the same outage, not a second one


def test_an_outage_still_due_when_the_writers_finish_runs_then(tmp_path: Path) -> None:
    run = _run(tmp_path, Outage(at=0.0, seconds=0.01), Outage(at=50.0, seconds=0.01))
    _outages(run, 0.0, writers_done=False)  # type: ignore[arg-type]
    _outages(run, 1.0, writers_done=False)  # type: ignore[arg-type]
    assert not run.outage_flag.exists()
    _outages(run, 2.0, writers_done=True)  # type: ignore[arg-type]
    assert not run.outage_flag.exists()
    assert run.report.outages == 2

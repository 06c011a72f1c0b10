"""Two ``outbox maintain`` at once: the second says in one line that another one is working on
the table and skips the table's upkeep. Before, both folded the same buckets, and the later one
logged "a writer committed meanwhile" per bucket, with deltalake's advice to use Snapshot
Isolation pasted in."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from outbox.app import maintenance
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.clock import SystemClock


def _superseded(ws: Path) -> Outbox:
    """A table whose every bucket holds superseded versions (the fold has work everywhere)."""
    ob = Outbox.open(ws, transport="memory", default_destination="d", compact_every=0)
    with ob.unit_of_work() as uow:
        for i in range(32):
            uow.create(f"doc-{i}", type="T", state={"n": 0})
    for n in (1, 2):
        with ob.unit_of_work() as uow:
            for i in range(32):
                doc = uow.get(f"doc-{i}")
                assert doc is not None
                doc.state["n"] = n
    return ob


def test_a_second_maintain_while_the_first_folds_skips_in_one_plain_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The second runs, start to end, after the first read its first bucket to fold and before
    it committed the fold: whatever the timing of two real processes, this is the overlap that
    conflicted."""
    from outbox.delta import fold

    ws = tmp_path / "ws"
    ob = _superseded(ws)
    real_merge = fold.fold_merge
    second: list[Result] = []
    merges: list[int] = []

    def merge_after_a_second_maintain(*args: Any) -> Any:
        merges.append(1)
        if len(merges) == 1:  # the first's first bucket (a second that folds comes here too)
            second.append(CliRunner().invoke(main, ["-w", str(ws), "maintain", "--json"]))
        return real_merge(*args)

    monkeypatch.setattr(fold, "fold_merge", merge_after_a_second_maintain)
    caplog.set_level(logging.INFO, logger="outbox.maintain")
    try:
        first = maintenance.maintain(
            ob.store,
            clock=SystemClock(),
            sql_url=ob.settings.sql_url,
            rescue_delay_seconds=ob.settings.rescue_delay,
        )
    finally:
        ob.close()
    [result] = second
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if r.name == "outbox.maintain"]
    assert not [m for m in said if "meanwhile" in m or "Snapshot Isolation" in m]
    [line] = [m for m in said if "another `outbox maintain`" in m]
    assert "\n" not in line
    assert line.endswith("this one skipped the table's upkeep")
    skipped = json.loads(result.stdout)
    assert "_outbox_maintain.lock is locked" in skipped["compacted"]["skipped"]
    assert skipped["version_after"] == skipped["version_before"]  # it changed nothing
    assert not skipped["checkpoint_written"]
    assert first.folded["rows_removed"] == 64  # the first did all of it, undisturbed
    assert first.folded["skipped"] == []

"""A dispatcher's mark row that commits just after the erase's MERGE (its writer read the
document before the erase) is found by the re-read and erased by a second MERGE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app import erasure
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.settings import Settings
from outbox.wiring.backends import open_document_store


def _rows_of(ws: Path, doc_id: str) -> int:
    with Outbox.open(ws, compact_every=0) as ob:
        found = ob.store._query(f"SELECT count(*) AS n FROM t WHERE id = '{doc_id}'")
    return int(found["n"][0].as_py())


def test_a_mark_row_committed_after_the_erase_merge_is_erased_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="people", compact_every=0) as ob:
        with ob.unit_of_work() as uow:
            uow.create("p1", type="Person").send("Created", {"id": "p1"})
        incarnation = ob.store.read(["p1"])[1]["p1"].incarnation
    late_writer = open_document_store(Settings.load(ws))
    merges: list[int] = []
    merge = erasure._merge_delete

    def merge_then_a_late_mark(*args: Any, **kwargs: Any) -> int:
        removed = merge(*args, **kwargs)
        if not merges:  # a dispatcher that read p1 before the erase writes its mark now
            late_writer.advance_watermarks({"p1": 1}, {"p1": incarnation})
        merges.append(removed)
        return removed

    monkeypatch.setattr(erasure, "_merge_delete", merge_then_a_late_mark)
    result = CliRunner().invoke(
        main,
        ["erase", "--id", "p1", "--pending", "drop", "--json"],
        env={"OUTBOX_WORKSPACE": str(ws)},
    )
    assert result.exit_code == 0, result.output
    assert _rows_of(ws, "p1") == 0
    assert merges == [2, 1]  # the version and its mark, then the late mark
    assert json.loads(result.stdout)["rows_removed"] == 3


def test_an_erase_that_loses_a_commit_race_to_a_fold_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process folds the bucket between the erase's read and its MERGE (both remove the
    same file): the erase's commit fails, and it retries on the new snapshot."""
    from outbox.delta.fold import fold_table

    ws = tmp_path / "ws"
    with Outbox.open(ws, default_destination="people", compact_every=0) as ob:
        for n in range(2):
            with ob.unit_of_work() as uow:
                doc = uow.get("p1") or uow.create("p1", type="Person")
                doc.state["n"] = n
    other = open_document_store(Settings.load(ws))
    remaining = erasure._remaining
    folded: list[int] = []

    def read_then_a_fold(*args: Any, **kwargs: Any) -> int:
        found = remaining(*args, **kwargs)
        if not folded:
            folded.append(fold_table(other, at=0).rows_removed)
        return found

    monkeypatch.setattr(erasure, "_remaining", read_then_a_fold)
    result = CliRunner().invoke(
        main,
        ["erase", "--id", "p1", "--pending", "drop", "--json"],
        env={"OUTBOX_WORKSPACE": str(ws)},
    )
    assert result.exit_code == 0, result.output
    assert folded == [1]  # the superseded version went in the fold
    report = json.loads(result.stdout)
    assert report["conflicts"] >= 1
    assert _rows_of(ws, "p1") == 0


def test_an_erase_cut_short_after_its_merge_is_completed_by_a_second_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue database fails after the rows are gone: the ledger still says requested, and
    `outbox erase --id` again (the table no longer has the id) purges and records it."""
    from outbox.app import erasure_sql
    from outbox.core.errors import QueueError

    ws = tmp_path / "ws"
    with (
        Outbox.open(ws, default_destination="people", compact_every=0) as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("p1", type="Person").send("Created", {"id": "p1"})
    purge = erasure_sql.purge

    def unreachable(*_args: Any, **_kwargs: Any) -> dict[str, int]:
        raise QueueError("the SQL queue is not reachable")

    monkeypatch.setattr(erasure_sql, "purge", unreachable)
    run = ["erase", "--id", "p1", "--pending", "drop", "--json"]
    env = {"OUTBOX_WORKSPACE": str(ws)}
    cut = CliRunner().invoke(main, run, env=env)
    assert cut.exit_code == 1, cut.output
    assert _rows_of(ws, "p1") == 0
    monkeypatch.setattr(erasure_sql, "purge", purge)
    again = CliRunner().invoke(main, run, env=env)
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["erased"] == ["p1"]
    assert report["sql_rows_deleted"]["outbox_queue_messages"] == 1

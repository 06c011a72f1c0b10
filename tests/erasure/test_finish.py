"""The finishing `outbox maintain`: it waits for the log trim to pass the erase commit, and a
mark row that landed after the erase (a dispatcher that read the document before it) is erased
again, the wait starting over from that commit."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.settings import Settings
from outbox.wiring.backends import open_document_store
from tests.erasure.scenario import ERASED, KEPT, QUEUE, Scene, _save, maintain_later


def _rows_of(ws: Path, doc_id: str) -> int:
    with Outbox.open(ws, compact_every=0) as ob:
        found = ob.store._query(f"SELECT count(*) AS n FROM t WHERE id = '{doc_id}'")
    return int(found["n"][0].as_py())


def _phase(ws: Path) -> list[str]:
    result = CliRunner().invoke(
        main, ["erase", "--status", "--json"], env={"OUTBOX_WORKSPACE": str(ws)}
    )
    return [r["phase"] for r in json.loads(result.stdout)["erasures"]]


def _erase_then_a_late_mark(ws: Path) -> Scene:
    """p1 erased, then a mark row of it appended by a dispatcher that read it before."""
    with Outbox.open(ws, default_destination=QUEUE, compact_every=0) as ob:
        _save(ob, ERASED, "someone@example.org", 0)
        _save(ob, KEPT, "kept@example.org", 0)
        incarnation = ob.store.read([ERASED])[1][ERASED].incarnation
    erased = CliRunner().invoke(
        main, ["erase", "--id", ERASED, "--pending", "drop"], env={"OUTBOX_WORKSPACE": str(ws)}
    )
    assert erased.exit_code == 0, erased.output
    open_document_store(Settings.load(ws)).advance_watermarks({ERASED: 1}, {ERASED: incarnation})
    assert _rows_of(ws, ERASED) == 1
    return Scene(ws, "unused", Settings.load(ws))


def test_a_late_mark_still_there_at_the_finish_is_erased_again(tmp_path: Path) -> None:
    scene = _erase_then_a_late_mark(tmp_path / "ws")
    first, second = maintain_later(scene, fold=False)  # nothing folds the mark away
    assert (first, second["erased_again"], second["finished"]) == (
        {"open": 1, "finished": 0, "erased_again": 0},
        1,
        0,
    )
    assert _rows_of(tmp_path / "ws", ERASED) == 0
    assert _phase(tmp_path / "ws") == ["erased"]  # and the wait starts over
    assert [r["finished"] for r in maintain_later(scene, fold=False)] == [0, 1]
    assert _phase(tmp_path / "ws") == ["done"]


def test_a_late_mark_folded_away_is_waited_for_until_the_trim_passes_the_fold(
    tmp_path: Path,
) -> None:
    """The fold removed the late mark in a commit the log still holds: its file (and that
    commit's change data, naming the id) go only when the trim passes it."""
    scene = _erase_then_a_late_mark(tmp_path / "ws")
    maintain_later(scene, rounds=1, fold=False)  # a checkpoint after the mark, no fold yet
    first, second = maintain_later(scene)
    assert (first["finished"], first["erased_again"], first["waiting_again"]) == (0, 0, 1)
    assert _rows_of(tmp_path / "ws", ERASED) == 0
    assert second["finished"] == 1
    assert _phase(tmp_path / "ws") == ["done"]

"""Deletes through the library (``uow.delete``) in the end-to-end checker: the writers delete
(with and without a last message, racing a save, re-created at once) among their rounds, the
supervisor deletes two dispatched documents where the outcome is forced, and the verdict holds
the current documents (``read_documents``) against the model the change data feed gives.

The delete decisions come from a generator of their own, so every seed's other operations are
the ones it had before deletes existed (the suite's seeds were chosen for what they place).

Here: the plans and the model. The seeds with deletes are the CI seeds (every seed deletes;
``tests/e2e/test_checker.py`` holds each to the delete outcomes, and pins that they place every
delete kind), and the delete's two broken builds run in the broken builds' pool
(``tests/e2e/test_checker_mutations.py``). Three seeds of their own and the two builds run one
after the other here took 177 s of a CI run (issue 43's suite time).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox.app.checker.documents import compare
from outbox.app.checker.scenario import DELETE_KINDS, Scenario
from outbox.app.checker.truth import truth_from_images
from outbox.core.model import OutboxMessage, message_id_for
from outbox.delta.schema import message_to_struct

SCALE = 0.5

AT = datetime(2026, 12, 1, tzinfo=UTC)


# --- the plan -------------------------------------------------------------------------------


def _without_deletes(sc: Scenario) -> Scenario:
    writers = [dataclasses.replace(w, deletes=()) for w in sc.writers]
    return dataclasses.replace(sc, writers=writers)


@pytest.mark.parametrize("writer", ["python", "spark"])
def test_deletes_leave_every_seeds_other_operations_as_they_were(writer: str) -> None:
    """Same seed, same plan; without its deletes, the plan the seed had before deletes."""
    for seed in range(1, 201):
        sc = Scenario.from_seed(seed, scale=SCALE, writer=writer)
        assert sc == Scenario.from_seed(seed, scale=SCALE, writer=writer)  # reproducible
        assert _without_deletes(sc) == Scenario.from_seed(
            seed, scale=SCALE, writer=writer, deletes=False
        )


def test_every_plan_deletes_races_and_re_creates() -> None:
    kinds: set[str] = set()
    for seed in range(1, 201):
        sc = Scenario.from_seed(seed, scale=SCALE)
        deletes = [(w, d) for w in sc.writers for d in w.deletes]
        assert any(d.kind == "raced" for d in sc.writers[1].deletes), sc.describe()
        assert any(d.recreate for _, d in deletes), sc.describe()
        for w, d in deletes:
            assert d.round < w.rounds, sc.describe()
            assert d.round not in w.stranded + w.conflicted, sc.describe()
        kinds |= {d.kind for _, d in deletes}
    assert kinds == set(DELETE_KINDS)


# --- the model ------------------------------------------------------------------------------


def _image(
    commit: int,
    version: int,
    incarnation: str,
    *,
    last_seq: int,
    dispatched_seq: int,
    deleted: bool = False,
    change: str = "insert",
    messages: int = 0,
) -> dict[str, Any]:
    outbox = [
        message_to_struct(
            OutboxMessage(
                seq=s,
                message_id=message_id_for("t", "pkg-1", s, incarnation),
                destination="shipments",
                type="StatusChanged",
                body=f'{{"seq": {s}}}',
            )
        )
        for s in range(last_seq - messages + 1, last_seq + 1)
    ]
    return {
        "id": "pkg-1",
        "version": version,
        "incarnation": incarnation,
        "last_seq": last_seq,
        "dispatched_seq": dispatched_seq,
        "outbox": outbox,
        "type": "package",
        "state": "{}" if deleted else '{"n": 1}',
        "deleted": deleted,
        "_change_type": change,
        "_commit_version": commit,
        "_commit_timestamp": AT,
    }


def _lives(*, sent: bool) -> list[dict[str, Any]]:
    """pkg-1 saved with a message, deleted with a last one, its tombstone marked sent or not, then
    created again in place (the tombstone's row becomes the new life's)."""
    a, b = "a" * 32, "b" * 32
    rows = [
        _image(1, 1, a, last_seq=1, dispatched_seq=1, messages=1),
        _image(2, 2, a, last_seq=2, dispatched_seq=1, deleted=True, messages=1),
    ]
    if sent:
        rows.append(_image(3, 0, a, last_seq=0, dispatched_seq=2))  # the watermark's mark row
    tomb = _image(4, 2, a, last_seq=2, dispatched_seq=1, deleted=True, change="update_preimage")
    reborn = _image(4, 3, b, last_seq=0, dispatched_seq=0, change="update_postimage")
    return [*rows, tomb, reborn]


def test_the_model_knows_a_new_life_over_a_sent_tombstone() -> None:
    model = truth_from_images(_lives(sent=True)).model
    assert (model.tombstones, model.new_lives, model.violations) == (1, 1, [])
    current = model.current()
    assert list(current) == ["pkg-1"]
    assert (current["pkg-1"].version, current["pkg-1"].incarnation) == (3, "b" * 32)


def test_the_model_refuses_a_new_life_over_an_unsent_tombstone() -> None:
    model = truth_from_images(_lives(sent=False)).model
    assert len(model.violations) == 1
    assert "over a tombstone whose last messages were not sent" in model.violations[0]


def test_a_deleted_document_is_absent_and_a_reader_showing_it_is_caught() -> None:
    truth = truth_from_images(_lives(sent=True)[:2])
    model = truth.model
    assert model.current() == {}
    assert model.deleted() == ["pkg-1"]
    assert compare("all", [], model.current(), set(model.deleted()), model.watermarks) == []
    shown = [{"id": "pkg-1", "version": 2}]
    [line] = compare("all", shown, model.current(), set(model.deleted()), model.watermarks)
    assert "'pkg-1' returned, but the model has it deleted" in line


def test_every_row_removed_is_a_deleted_document() -> None:
    """An erasure job's DELETE (every row of the id) ends the document as a tombstone does."""
    rows = _lives(sent=True)[:1]
    rows.append({**rows[0], "_change_type": "delete", "_commit_version": 2})
    model = truth_from_images(rows).model
    assert model.current() == {}
    assert model.deleted() == ["pkg-1"]
    assert model.tombstones == 0

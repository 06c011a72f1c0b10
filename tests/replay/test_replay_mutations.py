"""Replay's mechanisms removed one at a time, in ``tests/test_mutations.py``'s way (the function
recompiled from its source with one edit, patched in for the run): the owning test fails on the
named line with the edit. That it passes on the intact code is its own run in the suite (each
owner below is a test of tests/replay, called here as pytest calls it), not repeated per row.
Rows the lead may fold into that file's ``MUTATIONS``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutate import mutated
from tests.replay import (
    test_replay_cli,
    test_replay_fold,
    test_replay_history,
    test_replay_poison,
)
from tests.replay.helpers import build_history
from tests.test_mutations import SourceMutation, _failing_source_line, _owner_function


def _dry_run(tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True)
    test_replay_cli.test_the_dry_run_counts_the_messages_first_committed_in_the_range(
        build_history(tmp_path / "ws")
    )


def _fold(tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True)
    test_replay_fold.test_marks_and_a_fold_in_the_range_add_no_message(tmp_path)


def _recorded(tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as patch:
        test_replay_cli.test_a_chunk_delivered_again_after_it_was_recorded_is_completed_without_a_send(
            build_history(tmp_path / "ws"), patch
        )


def _holds(tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True)
    test_replay_history.test_an_unfinished_replay_holds_the_log_trim_and_a_finished_one_lets_it_go(
        tmp_path
    )


def _poison(tmp_path: Path) -> None:
    tmp_path.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as patch:
        test_replay_poison.test_a_refused_chunk_is_dead_lettered_alone_and_the_others_are_sent(
            tmp_path, patch
        )


MUTATIONS = [
    SourceMutation(
        "a replay counts the messages its range's rows repeat from before it (no before-range "
        "filter)",
        "outbox.app.replay_plan:committed_in_range",
        (
            (
                'keep = pc.greater(joined["seq"], pc.fill_null(joined["before_seq"], 0))',
                'keep = pc.greater(joined["seq"], 0)',
            ),
        ),
        "tests/replay/test_replay_cli.py::"
        "test_the_dry_run_counts_the_messages_first_committed_in_the_range",
        _dry_run,
        'assert out["by_destination_type"] == [',
    ),
    SourceMutation(
        "a replay counts the messages a fold's post-images repeat (no before-range filter)",
        "outbox.app.replay_plan:committed_in_range",
        (
            (
                'keep = pc.greater(joined["seq"], pc.fill_null(joined["before_seq"], 0))',
                'keep = pc.greater(joined["seq"], 0)',
            ),
        ),
        "tests/replay/test_replay_fold.py::test_marks_and_a_fold_in_the_range_add_no_message",
        _fold,
        'assert (after["messages"], after["by_destination_type"]) == (0, [])',
    ),
    SourceMutation(
        "a worker sends a chunk again that it recorded as sent",
        "dispatcher.replay_handler:ReplayHandler._unrecorded",
        (("if (cmd.replay, cmd.chunk) in done:", "if False:"),),
        "tests/replay/test_replay_cli.py::"
        "test_a_chunk_delivered_again_after_it_was_recorded_is_completed_without_a_send",
        _recorded,
        "assert delivered(h.ws) == before",
    ),
    SourceMutation(
        "the log trim ignores the replays that still read the history",
        "outbox.app.rescuer_history:_replays_holding",
        (
            (
                "return holding_versions(engine, table_uri, table_id, datetime.now(UTC), "
                "retention)",
                "return []",
            ),
        ),
        "tests/replay/test_replay_history.py::"
        "test_an_unfinished_replay_holds_the_log_trim_and_a_finished_one_lets_it_go",
        _holds,
        'assert (held["keep_from_version"], held["held_by"]) == (h.a, "rescuer")',
    ),
    SourceMutation(
        "a failed shared send fails every chunk in it (no fallback to a chunk at a time)",
        "dispatcher.replay_handler:ReplayHandler._send_together",
        (
            (
                "self._one_by_one(batch, held, built[recorded:])",
                "[self.settle._retry(batch, held, m, str(e)) for m, _, _ in built[recorded:]]",
            ),
        ),
        "tests/replay/test_replay_poison.py::"
        "test_a_refused_chunk_is_dead_lettered_alone_and_the_others_are_sent",
        _poison,
        'assert "1 dead-lettered" in result.output',
    ),
]


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_owning_test_catches_the_source_mutation(
    m: SourceMutation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = _owner_function(m)  # its intact run: the owner's own test in tests/replay
    cls, attr, broken = mutated(m.target, m.edits)
    monkeypatch.setattr(cls, attr, broken)
    with pytest.raises((AssertionError, pytest.fail.Exception)) as caught:
        m.run_owner(tmp_path / "mutated")
    monkeypatch.undo()
    assert m.failing_line in _failing_source_line(caught.value, owner), (
        f"{m.owner} failed elsewhere than on {m.failing_line!r}: {caught.value!r}"
    )

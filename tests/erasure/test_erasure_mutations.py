"""The erasure proof fails when a mechanism it relies on is removed (tests/test_mutations.py's
way: the one function recompiled with the edit, and the owner failing on the named line).

That each owner passes on the intact code is its own test in tests/erasure (each is called here
as pytest calls it), not run again here before its mutations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.erasure import (
    test_cli,
    test_finish,
    test_late_marks,
    test_proof,
    test_purge,
    test_tombstone,
)
from tests.mutate import failing_line, mutated

OWNER = test_proof.test_erasure_leaves_the_marker_nowhere_on_local_disk

#: (name, target, edits, the owner's failing line)
MUTATIONS = [
    (
        "no orphan sweep (a failed append's file stays)",
        "outbox.app.erasure:advance",
        (
            (
                "            storage_options=options,\n        )\n    )",
                "            storage_options=options,\n            dry_run=True,\n        )\n    )",
            ),
        ),
        "assert scene.table_hits() == []",
    ),
    (
        "the log trim keeps the trimmed commits' change data",
        "outbox.delta.log:change_files",
        (("out.append(path)  # never anything outside the table", "pass"),),
        "assert scene.table_hits() == []",
    ),
    (
        "the SQL purge misses the dead letters",
        "outbox.app.erasure_sql:purge",
        (
            (
                "by_message_or_session = (T.queue_messages, T.dead_letters)",
                "by_message_or_session = (T.queue_messages,)",
            ),
        ),
        "assert scene.queue_rows() == 0",
    ),
    (
        "the finished ledger keeps the id instead of its hash",
        "outbox.app.erasure_sql:mark",
        (('"doc_id": hashed(table_id, doc_id)}', '"doc_id": doc_id}'),),
        "assert scene.sql_hits(ERASED) == []",
    ),
]

LATE = test_late_marks.test_a_mark_row_committed_after_the_erase_merge_is_erased_too


@pytest.mark.parametrize("m", MUTATIONS, ids=[m[0] for m in MUTATIONS])
@pytest.mark.slow
def test_the_erasure_proof_catches_the_mutation(
    m: tuple[str, str, tuple[tuple[str, str], ...], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, target, edits, line = m
    owner, attr, broken = mutated(target, edits)
    original = getattr(owner, attr)
    monkeypatch.setattr(owner, attr, broken)
    with pytest.raises(AssertionError) as caught:
        OWNER(tmp_path / "mutated")
    monkeypatch.undo()
    assert getattr(owner, attr) is original  # the intact code is back for the next one
    assert line in failing_line(caught.value, test_proof.__file__), (
        f"{name}: failed elsewhere: {caught.value!r}"
    )


@pytest.mark.slow
def test_without_the_re_read_a_late_mark_row_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erase's MERGE once per bucket, no re-read: the late mark row stays in the table."""
    owner, attr, broken = mutated(
        "outbox.app.erasure:erase_rows",
        (("if not _remaining(store, bucket, members):", "if _round > 0:"),),
    )
    monkeypatch.setattr(owner, attr, broken)
    (tmp_path / "mutated").mkdir()
    with pytest.raises(AssertionError) as caught, pytest.MonkeyPatch.context() as patch:
        LATE(tmp_path / "mutated", patch)
    assert 'assert _rows_of(ws, "p1") == 0' in failing_line(
        caught.value, test_late_marks.__file__
    ), caught.value


@pytest.mark.parametrize(
    ("target", "edit"),
    [
        ("outbox.app.erasure_sql:checkpoint_wal", ('sqlite.execute("VACUUM")', "pass")),
        (
            "outbox.app.erasure_sql:checkpoint_wal",
            ('"PRAGMA wal_checkpoint(TRUNCATE)"', '"SELECT 0"'),
        ),
    ],
    ids=["no VACUUM", "no WAL checkpoint"],
)
@pytest.mark.slow
def test_without_zeroing_the_sqlite_file_keeps_the_bytes(
    target: str, edit: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    test_purge.upgrade(url)
    owner, attr, broken = mutated(target, (edit,))
    monkeypatch.setattr(owner, attr, broken)
    with pytest.raises(AssertionError) as caught:
        test_purge.test_purge_by_message_id_and_session_keeps_other_documents(url)
    assert "assert scan_folder(folder, marker) == []" in failing_line(
        caught.value, test_purge.__file__
    ), caught.value


@pytest.mark.parametrize(
    "m",
    [
        (
            "outbox.app.erasure:advance",
            ('late = sorted(set(_rows_of(store, list(passed))["id"].to_pylist()))', "late = []"),
            test_finish.test_a_late_mark_still_there_at_the_finish_is_erased_again,
            'assert (first, second["erased_again"], second["finished"]) == (',
        ),
        (
            "outbox.app.erasure:advance",
            ("touched = _touched_since(store, passed, oldest, skip=set(late))", "touched = {}"),
            test_finish.test_a_late_mark_folded_away_is_waited_for_until_the_trim_passes_the_fold,
            'assert (first["finished"], first["erased_again"], first["waiting_again"]) == (0, 0, 1',
        ),
    ],
    ids=["the finish never re-reads the table", "the finish ignores commits after the erase"],
)
@pytest.mark.slow
def test_the_finish_checks_catch_their_mutation(
    m: tuple[str, tuple[str, str], Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, edit, owner, line = m
    broken_owner, attr, broken = mutated(target, (edit,))
    monkeypatch.setattr(broken_owner, attr, broken)
    with pytest.raises(AssertionError) as caught:
        owner(tmp_path / "mutated")
    assert line in failing_line(caught.value, test_finish.__file__), caught.value


@pytest.mark.slow
def test_joining_on_the_ids_puts_an_id_in_the_erase_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = test_cli.test_the_erase_commit_and_its_checkpoint_name_no_erased_id
    target, attr, broken = mutated(
        "outbox.app.erasure:_merge_delete",
        (
            (
                '"h": pa.array([ledger.hashed(table_id, i) for i in ids], pa.string()),',
                '"h": pa.array([ledger.hashed(table_id, i) for i in ids], pa.string()),'
                ' "id": pa.array(list(ids), pa.string()),',
            ),
            ('f"AND {hashed_id} = s.h",', '"AND t.id = s.id",'),
        ),
    )
    monkeypatch.setattr(target, attr, broken)
    (tmp_path / "mutated").mkdir()
    with pytest.raises(AssertionError) as caught:
        owner(tmp_path / "mutated")
    assert 'assert f"{version:020d}.json" not in hits' in failing_line(
        caught.value, test_cli.__file__
    ), caught.value


@pytest.mark.slow
def test_without_the_retry_a_lost_commit_race_fails_the_erase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = test_late_marks.test_an_erase_that_loses_a_commit_race_to_a_fold_retries
    target, attr, broken = mutated(
        "outbox.app.erasure:_merge_delete",
        (
            (
                'if not isinstance(e, CommitFailedError) and "concurrent" not in str(e).lower():',
                "if True:",
            ),
        ),
    )
    monkeypatch.setattr(target, attr, broken)
    (tmp_path / "mutated").mkdir()
    with pytest.raises(AssertionError) as caught, pytest.MonkeyPatch.context() as patch:
        owner(tmp_path / "mutated", patch)
    assert "assert result.exit_code == 0, result.output" in failing_line(
        caught.value, test_late_marks.__file__
    ), caught.value


def _race(path: Path, patch: pytest.MonkeyPatch) -> None:
    test_tombstone.test_a_racing_save_is_followed_by_the_tombstone_a_later_one_refused(path, patch)


def _where(path: Path, _patch: pytest.MonkeyPatch) -> None:
    test_tombstone.test_where_selects_what_the_readers_show_tombstones_included(path)


_OLD_WHERE = (
    'sql = f"SELECT id FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY version DESC) '
    'AS _rn FROM t) AS v WHERE _rn = 1 AND version > 0 AND ({where})"'
)


@pytest.mark.parametrize(
    "m",
    [
        (
            "outbox.app.erasure:write_tombstones",
            (("uow.delete(doc)", "pass"),),
            _race,
            'assert outcome == ["refused"]',
        ),
        (
            "outbox.app.erasure:write_tombstones",
            (("continue", "raise"),),
            _race,
            "assert result.exit_code == 0, result.output",
        ),
        (
            "outbox.app.erasure:select_ids",
            (("include_deleted=True", "include_deleted=False"),),
            _where,
            'assert _dry(ws, "type = \'Person\'") == ["s1", "t1", "u1"]',
        ),
        (
            "outbox.app.erasure:select_ids",
            (('sql = f"SELECT id FROM ({current}) AS _c WHERE ({where})"', _OLD_WHERE),),
            _where,
            'assert _dry(ws, "dispatched_seq < last_seq")',
        ),
    ],
    ids=[
        "no tombstone (a save after the send is erased unsent)",
        "no retry after a racing save",
        "--where without tombstones",
        "--where over the newest raw row (the erase's own query before current_sql)",
    ],
)
@pytest.mark.slow
def test_the_tombstone_and_the_where_catch_their_mutation(
    m: tuple[str, tuple[tuple[str, str], ...], Any, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, edits, owner, line = m
    broken_owner, attr, broken = mutated(target, edits)
    monkeypatch.setattr(broken_owner, attr, broken)
    (tmp_path / "mutated").mkdir()
    with pytest.raises(AssertionError) as caught, pytest.MonkeyPatch.context() as patch:
        owner(tmp_path / "mutated", patch)
    assert line in failing_line(caught.value, test_tombstone.__file__), caught.value

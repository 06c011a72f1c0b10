"""Source mutations of the rule (tests/test_mutations.py's way, on the readers' table): each
removes one mechanism of ``outbox.delta.current`` and the reader check that owns it must fail on
its assertion. The table is built once, intact; only the reads run mutated (a mutation of the
Arrow form would otherwise change what the builder's saves copy, and the model with it). That
each owning check passes on the intact rule is its own test in tests/readers/test_every_reader.py
(on the same table, built the same way), not run again here: three checks own the seven
mutations, and an intact pass reads every version twice over.

The mechanisms: a tombstone hides its document (both forms); the watermark is the highest over
the life's rows, not the newest row's (both forms: the Arrow one is also tests/test_mutations.py's
row for the write path); a life is (id, incarnation), not the id (both forms).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from testkit.table_states import TableStates
from tests.mutate import failing_line, mutated
from tests.readers import checks


@dataclass(frozen=True)
class ReaderMutation:
    name: str
    target: str
    edits: tuple[tuple[str, str], ...]
    owner: Callable[[TableStates], None]
    failing_line: str


_SQL = "outbox.delta.current:current_sql"
_ARROW = "outbox.delta.current:current_rows"
_VISIBLE = "outbox.delta.current:_visible"
_SQL_CHECK = "assert got == t.documents(v, include_deleted=deleted), (v, t.step_of[v], deleted)"

MUTATIONS = [
    ReaderMutation(
        "the SQL rule shows tombstones",
        _SQL,
        (("if has_deleted and not include_deleted else", "if False else"),),
        checks.check_all_documents,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "the Arrow rule shows tombstones",
        _VISIBLE,
        (("if not include_deleted and DELETED in latest.column_names:", "if False:"),),
        checks.check_documents_by_id,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "the SQL rule takes the newest row's watermark, not its life's highest",
        _SQL,
        (
            (
                "max(dispatched_seq) OVER (PARTITION BY id, {INCARNATION}) AS _ds",
                "dispatched_seq AS _ds",
            ),
        ),
        checks.check_all_documents,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "the Arrow rule takes the newest row's watermark, not its life's highest",
        _ARROW,
        (("if latest.num_rows == keyed.num_rows:", "if True:"),),
        checks.check_documents_by_id,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "the SQL rule's life is the id, whatever its incarnation",
        _SQL,
        (("OVER (PARTITION BY id, {INCARNATION}) AS _ds", "OVER (PARTITION BY id) AS _ds"),),
        checks.check_all_documents,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "the Arrow rule's life is the id, whatever its incarnation",
        _ARROW,
        (("pc.cast(table[INCARNATION], pa.string())", "pc.cast(table['id'], pa.string())"),),
        checks.check_documents_by_id,
        _SQL_CHECK,
    ),
    ReaderMutation(
        "polars reads the generated SQL without its tombstone filter",
        _SQL,
        (("if has_deleted and not include_deleted else", "if False else"),),
        checks.check_polars,
        "assert as_model(got) == t.documents(v), (v, t.step_of[v])",
    ),
]


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_the_reader_check_catches_the_mutation(
    m: ReaderMutation, states: TableStates, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, attr, broken = mutated(m.target, m.edits)
    original = getattr(owner, attr)
    monkeypatch.setattr(owner, attr, broken)
    with pytest.raises(AssertionError) as caught:
        m.owner(states)
    monkeypatch.undo()
    code = m.owner.__code__
    assert m.failing_line in failing_line(caught.value, code.co_filename, m.owner.__name__)
    assert getattr(owner, attr) is original  # the intact rule is back for the next one

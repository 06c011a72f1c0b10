"""The save's MERGE guards, each tested at the store on its own (issue 29, item 7).

A unit of work reaches the store through the snapshot re-check, so a guard inside the MERGE can
go missing unnoticed there: these tests call the store so that the MERGE's own predicate is the
only thing between a wrong write and the table. ``tests/test_mutations.py`` removes each guard and
requires the test here to fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from dispatcher.watermarks import MarkBatch
from outbox import ConcurrencyError, Outbox
from outbox.core.model import DocumentRow
from outbox.delta.store import DeltaDocumentStore, DocumentWrite


class _StaleMarks:
    """``PendingWatermarks`` holding one batch of marks (as a dispatcher's ``WatermarkWriter``
    would after its messages were accepted), recording how the save settled it."""

    def __init__(self, marks: dict[str, tuple[int, str | None]]) -> None:
        self.batch: MarkBatch | None = MarkBatch(marks, {d: 1 for d in marks})
        self.settled: list[tuple[BaseException | None, bool]] = []

    def flush(self) -> None:
        """Nothing is written by a read here: the batch waits for the save to carry it."""

    def take(self, exclude: Iterable[str] = ()) -> MarkBatch | None:
        batch, self.batch = self.batch, None
        return batch

    def settle(self, batch: Any, error: BaseException | None, *, carried: bool = False) -> None:
        self.settled.append((error, carried))


def _row(ob: Outbox, doc_id: str) -> DocumentRow:
    _, rows = ob.store.read([doc_id])
    return rows[doc_id]


def test_a_save_carrying_a_stale_mark_keeps_the_higher_watermark(ob: Outbox) -> None:
    """I4: another process advanced "a" to 3; a save of "b" carries a mark of 1 for "a" (this
    process's dispatcher sent only seq 1); ``dispatched_seq`` of "a" stays 3."""
    with ob.unit_of_work() as uow:
        a = uow.create("a", type="T")
        for k in range(3):
            a.send("E", {"k": k}, destination="q")
        uow.create("b", type="T", state={"n": 0})
    incarnation = _row(ob, "a").incarnation
    other = DeltaDocumentStore(ob.settings.table_uri)  # another process's dispatcher
    try:
        assert other.advance_watermarks({"a": 3}, {"a": incarnation}) is not None
    finally:
        other.close()
    marks = _StaleMarks({"a": (1, incarnation)})  # this process sent only seq 1 of "a"
    ob.store.attach_watermarks(marks)
    try:
        with ob.unit_of_work() as uow:
            b = uow.get("b")
            assert b is not None
            b.state["n"] = 1
    finally:
        ob.store.detach_watermarks(marks)
    assert marks.settled == [(None, True)]  # the stale mark rode along in the save's MERGE
    assert _row(ob, "b").state == {"n": 1}
    assert _row(ob, "a").dispatched_seq == 3  # I4: never lowered by a carried mark


def test_a_stale_expected_version_on_a_current_snapshot_raises_and_writes_nothing(
    ob: Outbox,
) -> None:
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"n": 0})
    with ob.unit_of_work() as uow:
        a = uow.get("a")
        assert a is not None
        a.state["n"] = 1  # version 2 now
    current = ob.store.refresh()
    row = _row(ob, "a")
    assert row.version == 2
    stale = DocumentRow(
        "a", row.type, 2, {"n": 99}, row.last_seq, row.dispatched_seq, [], None, row.incarnation
    )
    # Read "at" the current snapshot, so no re-check runs: the MERGE's version predicate is all
    # that stands between a save that read version 1 and the document at version 2.
    with pytest.raises(ConcurrencyError):
        ob.store.save([DocumentWrite(stale, expected_version=1, read_at=current)])
    assert ob.store.refresh() == current  # nothing was committed
    after = _row(ob, "a")
    assert (after.version, after.state) == (2, {"n": 1})

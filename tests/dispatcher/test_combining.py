"""The dispatch combiner (dispatcher/combining.py): commits that finish while a dispatch runs
share the next call, each caller returns only once its rows' call did, and a crash reaches every
caller it carried. Each test places the threads with events, never with time."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from dispatcher.combining import DispatchCombiner
from outbox.core.model import DocumentRow


class Crash(BaseException):
    """Stands for the process dying inside a dispatch."""


class Signalling(list[Any]):
    """The combiner's queue, telling the test when an entry was queued."""

    def __init__(self, on_append: Callable[[], None]) -> None:
        super().__init__()
        self._on_append = on_append

    def append(self, item: Any) -> None:
        super().append(item)
        self._on_append()


def row(doc: str, version: int = 1, life: str | None = None) -> DocumentRow:
    return DocumentRow(doc, "t", version, {}, 0, 0, [], incarnation=life)


def run(combiner: DispatchCombiner, rows: Sequence[DocumentRow], log: list[Any]) -> Any:
    def go() -> None:
        try:
            combiner.dispatch(rows)
            log.append(("returned", rows[0].id))
        except Crash:
            log.append(("crashed", rows[0].id))

    t = threading.Thread(target=go)
    t.start()
    return t


def commits_during_the_first_call(
    *, fail_second: bool = False
) -> tuple[DispatchCombiner, list[Any], list[list[str]]]:
    """A's call runs while B and C commit (each queued before A's call returns); then B's and
    C's rows are dispatched. Returns the combiner, the log and the calls' ids."""
    log: list[Any] = []
    calls: list[list[str]] = []
    combiner: DispatchCombiner
    threads: list[threading.Thread] = []

    def dispatch_all(rows: Sequence[DocumentRow], started: float) -> None:
        ids = [r.id for r in rows]
        calls.append(ids)
        if len(calls) == 1:
            queued = threading.Semaphore(0)
            combiner._queue = Signalling(queued.release)
            for doc in ("b", "c"):  # b queues before c
                threads.append(run(combiner, [row(doc)], log))
                assert queued.acquire(timeout=30), f"{doc} never queued"
        elif fail_second:
            raise Crash()
        log.append(("call done", ids))

    combiner = DispatchCombiner(dispatch_all)
    run(combiner, [row("a")], log).join(30)
    for t in threads:
        t.join(30)
    return combiner, log, calls


def test_commits_queued_during_a_dispatch_share_the_next_call() -> None:
    combiner, log, calls = commits_during_the_first_call()
    assert calls == [["a"], ["b", "c"]]  # off: three calls, one per commit
    assert (combiner.calls, combiner.combined) == (2, 1)
    # each caller returns only once the call that carried its rows is done
    done_bc = log.index(("call done", ["b", "c"]))
    assert log.index(("returned", "b")) > done_bc
    assert log.index(("returned", "c")) > done_bc
    assert log.index(("returned", "a")) > log.index(("call done", ["a"]))


def test_a_crash_in_a_combined_call_reaches_every_caller_it_carried() -> None:
    _, log, calls = commits_during_the_first_call(fail_second=True)
    assert calls == [["a"], ["b", "c"]]
    assert ("returned", "a") in log
    assert {e for e in log if e[0] == "crashed"} == {("crashed", "b"), ("crashed", "c")}


def test_switched_off_each_commit_is_dispatched_alone() -> None:
    calls: list[list[str]] = []
    combiner = DispatchCombiner(lambda rows, started: calls.append([r.id for r in rows]))
    combiner.enabled = False
    combiner.dispatch([row("a")])
    combiner.dispatch([row("b")])
    assert calls == [["a"], ["b"]]
    assert (combiner.calls, combiner.combined) == (2, 0)


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_a_document_committed_twice_goes_out_once_as_its_newest_row(
    order: tuple[int, int],
) -> None:
    """Its newest row holds the older commit's pending messages too; the dispatcher alone keeps
    whichever row comes last, and two threads may queue in either order."""
    from dispatcher.combining import _Entry, newest_rows

    entries = [_Entry([row("d", v), row(f"other{v}")], 0.0) for v in order]
    rows = newest_rows(entries)
    assert [(r.id, r.version) for r in rows if r.id == "d"] == [("d", 2)]
    assert len(rows) == 3
    # another life of the id (a foreign delete and create): the one queued last
    lives = newest_rows([_Entry([row("d", 5, "old")], 0.0), _Entry([row("d", 1, "new")], 0.0)])
    assert [(r.version, r.incarnation) for r in lives] == [(1, "new")]

"""Group commit: units of work queued while another commits share the next Delta commit, and a
stale one among them fails alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from outbox import ConcurrencyError, Outbox


def _gate_merges(
    store: Any, queued: int
) -> tuple[list[int], threading.Event, threading.Event, threading.Event]:
    """Hold the store's first MERGE until ``release`` is set; ``calls`` gets each MERGE's number
    of writes, ``first_in`` is set when the first one is held, ``queued_all`` once ``queued``
    units of work wait behind it. Returns (calls, first_in, release, queued_all)."""
    real_merge = store._append_documents
    first_in, release, queued_all = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def gated(writes: Any, current: int) -> None:
        calls.append(len(writes))
        if len(calls) == 1:
            first_in.set()
            assert release.wait(30)
        real_merge(writes, current)

    store._append_documents = gated

    class WatchedQueue(list[Any]):
        def append(self, item: Any) -> None:
            super().append(item)
            if len(self) >= queued:
                queued_all.set()

    store._queue = WatchedQueue()
    return calls, first_in, release, queued_all


def test_queued_units_of_work_share_one_commit_and_fail_alone(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        uow.create("x", type="T", state={"n": 0})
    store = ob.store
    calls, first_in, release, queued_five = _gate_merges(store, 5)

    stale = ob.unit_of_work()
    stale_doc = stale.get("x")  # read at version 1 of "x"
    assert stale_doc is not None
    results: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            results[name] = fn()
        except Exception as e:
            results[name] = e

    def bump_x() -> int | None:
        with ob.unit_of_work() as u:
            d = u.get("x")
            assert d is not None
            d.state["n"] = 1
        return u.committed_version

    def create(i: int) -> Any:
        def go() -> int | None:
            with ob.unit_of_work() as u:
                u.create(f"new-{i}", type="T").send("E", {"i": i}, destination="q")
            return u.committed_version

        return go

    def stale_commit() -> int | None:
        stale_doc.state["n"] = 99
        return stale.commit()

    leader = threading.Thread(target=run, args=("leader", bump_x))
    leader.start()
    assert first_in.wait(30)
    followers = [threading.Thread(target=run, args=(f"c{i}", create(i))) for i in range(4)]
    followers.append(threading.Thread(target=run, args=("stale", stale_commit)))
    for t in followers:
        t.start()
    assert queued_five.wait(30)  # all five queued behind the gated commit
    release.set()
    for t in [leader, *followers]:
        t.join(60)

    assert isinstance(results["stale"], ConcurrencyError)
    versions = {results[f"c{i}"] for i in range(4)}
    assert len(versions) == 1, results  # the four creates shared one commit
    assert calls == [1, 4]  # the stale unit of work never reached the MERGE
    assert store.group_commits == 1
    _, rows = store.read(["x", *(f"new-{i}" for i in range(4))])
    assert rows["x"].state == {"n": 1}
    assert all(rows[f"new-{i}"].last_seq == 1 for i in range(4))


@pytest.mark.parametrize("group", [True, False])
def test_many_threads_lose_nothing(ob: Outbox, group: bool) -> None:
    ob.store.group_commit = group
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(5):
                with ob.unit_of_work() as u:
                    u.create(f"t{t}-{i}", type="T").send("E", {}, destination="q")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    table = ob.store.delta_table
    table.update_incremental()
    assert table.to_pyarrow_table(columns=["id"]).num_rows == 30
    if not group:
        assert ob.store.group_commits == 0


def test_queued_watermarks_share_one_merge_and_never_go_down(ob: Outbox) -> None:
    with ob.unit_of_work() as uow:
        for d in ("a", "b", "c"):
            doc = uow.create(d, type="T")
            for _ in range(5):
                doc.send("E", {}, destination="q")
    store = ob.store
    real = store._append_marks
    calls: list[dict[str, int]] = []
    first_in, release, queued = threading.Event(), threading.Event(), threading.Event()

    def gated(marks: Any) -> Any:
        calls.append({d: m[0] for d, m in marks.items()})  # (seq, checked, incarnation)
        if len(calls) == 1:
            first_in.set()
            assert release.wait(30)
        return real(marks)

    class WatchedQueue(list[Any]):
        def append(self, item: Any) -> None:
            super().append(item)
            if len(self) >= 3:
                queued.set()

    store._append_marks = gated  # type: ignore[method-assign]
    store._mark_queue = WatchedQueue()
    results: dict[str, Any] = {}

    def advance(name: str, marks: dict[str, int]) -> None:
        results[name] = store.advance_watermarks(marks)

    leader = threading.Thread(target=advance, args=("leader", {"a": 1}))
    leader.start()
    assert first_in.wait(30)
    followers = [
        threading.Thread(target=advance, args=(n, m))
        for n, m in (("f1", {"a": 3, "b": 2}), ("f2", {"a": 2, "c": 5}), ("f3", {"b": 4}))
    ]
    for t in followers:
        t.start()
    assert queued.wait(30)
    release.set()
    for t in [leader, *followers]:
        t.join(60)
    assert calls == [{"a": 1}, {"a": 3, "b": 4, "c": 5}]  # the highest mark per document
    assert results["f1"] == results["f2"] == results["f3"] is not None
    assert store.watermark_groups == 1
    rows = store.read(["a", "b", "c"])[1]
    assert {d: r.dispatched_seq for d, r in rows.items()} == {"a": 3, "b": 4, "c": 5}


def test_a_failure_outside_the_merge_reaches_every_queued_unit_of_work(ob: Outbox) -> None:
    """Regression: a read error during the re-check left followers waiting forever."""
    from outbox.core.errors import StoreError

    with ob.unit_of_work() as uow:
        uow.create("x", type="T")
    store = ob.store
    real_merge, real_scan = store._append_documents, store._scan
    first_in, release, queued = threading.Event(), threading.Event(), threading.Event()

    def gated(writes: Any, current: int) -> None:
        first_in.set()
        assert release.wait(30)
        store._append_documents = real_merge  # type: ignore[method-assign]
        real_merge(writes, current)

    def broken_scan(*a: Any, **k: Any) -> Any:
        raise OSError("disk went away")

    class WatchedQueue(list[Any]):
        def append(self, item: Any) -> None:
            super().append(item)
            if len(self) >= 2:
                queued.set()

    stale = ob.unit_of_work()
    x = stale.get("x")  # read before the leader commits: its save must re-check
    assert x is not None
    store._append_documents = gated  # type: ignore[method-assign]
    results: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            fn()
            results[name] = "ok"
        except Exception as e:
            results[name] = e

    def create(name: str) -> Any:
        def go() -> None:
            with ob.unit_of_work() as u:
                u.create(name, type="T")

        return go

    def update_x() -> None:
        x.state["n"] = 1
        stale.commit()

    leader = threading.Thread(target=run, args=("leader", create("leader")))
    leader.start()
    assert first_in.wait(30)
    store._queue = WatchedQueue()  # the leader's ticket is taken; watch the followers queue
    store._scan = broken_scan  # type: ignore[method-assign]  # the followers' re-check fails
    followers = [
        threading.Thread(target=run, args=("f1", create("f1"))),
        threading.Thread(target=run, args=("x", update_x)),
    ]
    for t in followers:
        t.start()
    assert queued.wait(30)
    release.set()
    for t in [leader, *followers]:
        t.join(30)
        assert not t.is_alive(), "a unit of work was left waiting"
    assert results["leader"] == "ok"
    for name in ("f1", "x"):
        assert isinstance(results[name], StoreError), results
        assert "disk went away" in str(results[name])
    store._scan = real_scan  # type: ignore[method-assign]
    assert store.read(["f1"])[1] == {}  # nothing of the failed group was written
    assert store.read(["x"])[1]["x"].version == 1

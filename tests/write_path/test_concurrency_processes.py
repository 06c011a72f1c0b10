"""Optimistic concurrency with real processes (``tests.children``: from a fork server, not forked
from pytest: deltalake hangs in children forked from a process that has used it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outbox.core.errors import ConcurrencyError
from tests import children

pytestmark = pytest.mark.slow


def _open(ws: str) -> Any:
    from outbox.app.facade import Outbox
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore

    settings = Settings(workspace=Path(ws))
    return Outbox(settings, DeltaDocumentStore(settings.table_uri), clock=_clock())


def _clock() -> Any:
    from outbox.core.clock import SystemClock

    return SystemClock()


def _race_same_document(ws: str, who: str, rounds: int, sync: tuple[Any, Any, Any]) -> None:
    """``rounds`` races, each from a fresh outbox (a fresh read of the table, as a new process
    has): both racers read ``a``, meet at ``start``, commit; then wait at ``checked`` while the
    parent looks at the round's outcome (``sync``: the two barriers and the results queue)."""
    start, checked, results = sync
    for r in range(rounds):
        ob = _open(ws)
        uow = ob.unit_of_work()
        doc = uow.get("a")
        assert doc is not None
        doc.state["winner"] = who
        doc.send("Changed", {"by": who}, destination="q")
        start.wait()
        try:
            uow.commit()
            results.put((r, who, "ok"))
        except ConcurrencyError:
            results.put((r, who, "conflict"))
        except Exception as e:  # pragma: no cover - reported to the parent
            results.put((r, who, f"error: {type(e).__name__}: {e}"))
        ob.close()
        checked.wait()


def _increment(ws: str, doc_id: str, times: int, barrier: Any, results: Any) -> None:
    ob = _open(ws)
    barrier.wait()
    conflicts = 0
    done = 0
    while done < times:
        try:
            with ob.unit_of_work() as uow:
                doc = uow.get(doc_id)
                assert doc is not None
                doc.state["n"] = doc.state.get("n", 0) + 1
                doc.send("Incremented", {"n": doc.state["n"]}, destination="q")
            done += 1
        except ConcurrencyError:
            conflicts += 1
    results.put((doc_id, conflicts, ob.store.commit_retries))


@pytest.fixture
def seeded(workspace: Path) -> str:
    from tests.write_path.conftest import bare_outbox

    ob = bare_outbox(workspace)
    with ob.unit_of_work() as uow:
        uow.create("a", type="T", state={"n": 0})
        uow.create("b", type="T", state={"n": 0})
    return str(workspace)


def test_two_processes_saving_one_document_one_wins(seeded: str) -> None:
    """Three races, in the same two processes (a pair of processes each cost seconds to start):
    each race starts from both racers' fresh read of the document."""
    ctx = children.ctx
    rounds = 3
    start, checked, results = ctx.Barrier(2, timeout=120), ctx.Barrier(3, timeout=120), ctx.Queue()
    procs = [
        children.process(_race_same_document, seeded, w, rounds, (start, checked, results))
        for w in ("p1", "p2")
    ]
    for p in procs:
        p.start()
    try:
        for r in range(rounds):
            got = [results.get(timeout=120) for _ in procs]
            assert {g[0] for g in got} == {r}, got
            outcomes = {who: outcome for _, who, outcome in got}
            assert sorted(outcomes.values()) == ["conflict", "ok"], (r, outcomes)
            winner = next(w for w, o in outcomes.items() if o == "ok")
            ob = _open(seeded)
            _, rows = ob.store.read(["a"])
            ob.close()
            row = rows["a"]
            assert row.state["winner"] == winner
            # exactly the winner's message was added: no lost update, no double write
            assert [m.body for m in row.outbox][-1] == f'{{"by":"{winner}"}}'
            assert row.last_seq == row.version - 1
            checked.wait()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def test_concurrent_increments_lose_nothing(seeded: str) -> None:
    """Two processes increment the same document 8 times each, retrying on ConcurrencyError;
    a third increments another document. Every increment lands exactly once."""
    ctx = children.ctx
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [children.process(_increment, seeded, d, 8, barrier, results) for d in ("a", "a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    for _ in procs:
        results.get(timeout=5)
    ob = _open(seeded)
    _, rows = ob.store.read(["a", "b"])
    assert rows["a"].state["n"] == 16
    assert rows["b"].state["n"] == 8
    assert rows["a"].last_seq == 16
    assert sorted(int(m.body.split(":")[1].rstrip("}")) for m in rows["a"].outbox) == list(
        range(1, 17)
    )

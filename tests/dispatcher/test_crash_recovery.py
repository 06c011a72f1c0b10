"""I1, I2, I3, I4 and I6 under crashes at every named point: by an injected exception (in process,
in-memory transport, so duplicates are visible) and by SIGKILL of a real process (SQL transport).

After each crash, recovery goes through the worker, as after a rescue pass: a ProcessDocument
command for every pending document. Then: every committed message delivered at least once, first
deliveries in seq order per document, no phantoms, duplicates share their message_id, and every
watermark reached last_seq.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.invariants import verify_deliveries
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage
from outbox.testing.crash_points import InjectedCrash, crash_points
from outbox.testing.faulty import FaultyTransport
from tests import children
from tests.dispatcher import procs
from tests.dispatcher.helpers import write_docs
from tests.dispatcher.recovery import recover, recover_and_verify

N_DOCS, N_MSGS = 4, 3


def assert_all_dispatched(ob: Outbox, committed: dict[str, list[OutboxMessage]]) -> None:
    _, rows = ob.store.read(list(committed))
    assert {i: (r.dispatched_seq, r.last_seq) for i, r in rows.items()} == {
        i: (len(m), len(m)) for i, m in committed.items()
    }


def open_memory(workspace: Path, clock: ManualClock, **kw: Any) -> tuple[Outbox, FaultyTransport]:
    memory = InMemoryTransport()
    faulty = FaultyTransport(memory, clock=clock)
    ob = Outbox.open(
        workspace, clock=clock, transport=faulty, default_destination="shipments", **kw
    )
    ob.runtime.dispatcher.max_batch_messages = 2  # several sends per dispatch: a real "mid batch"
    return ob, faulty


@pytest.mark.parametrize(
    ("point", "at_hit"),
    [
        ("after_commit", 1),
        ("mid_batch", 1),
        ("mid_batch", 3),
        ("after_send", 1),
        ("during_watermark", 1),
    ],
)
def test_injected_crash_in_immediate_dispatch(
    workspace: Path, clock: ManualClock, point: str, at_hit: int
) -> None:
    ob, faulty = open_memory(workspace, clock)
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        crash_points.arm(point, at_hit=at_hit)
        with pytest.raises(InjectedCrash):
            write_docs(ob, committed, N_DOCS, N_MSGS)
        assert crash_points.fired == [point]
        recover(ob)
        memory = faulty.inner
        assert isinstance(memory, InMemoryTransport)
        report = verify_deliveries(committed, memory.deliveries)
        assert report.ok, report.describe()
        assert_all_dispatched(ob, committed)
        if point in ("after_send", "during_watermark"):
            assert report.duplicates == N_DOCS * N_MSGS  # all sent, none recorded: all re-sent


def test_crash_after_the_broker_took_part_of_a_batch(workspace: Path, clock: ManualClock) -> None:
    ob, faulty = open_memory(workspace, clock)
    with ob:
        ob.runtime.dispatcher.max_batch_messages = 100
        faulty.deliver_partially(5, crash=True)
        committed: dict[str, list[OutboxMessage]] = {}
        with pytest.raises(InjectedCrash):
            write_docs(ob, committed, N_DOCS, N_MSGS)
        recover(ob)
        assert isinstance(faulty.inner, InMemoryTransport)
        report = verify_deliveries(committed, faulty.inner.deliveries)
        assert report.ok, report.describe()
        assert report.duplicates == 5


def test_watermark_written_but_its_acknowledgement_lost(
    workspace: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ob, faulty = open_memory(workspace, clock, watermark_window=0)  # the inline MERGE
    with ob:
        real = ob.store.advance_watermarks

        def commit_then_die(marks: Any, incarnations: Any = None) -> Any:
            real(marks, incarnations)
            raise InjectedCrash("during_watermark")

        monkeypatch.setattr(ob.store, "advance_watermarks", commit_then_die)
        committed: dict[str, list[OutboxMessage]] = {}
        with pytest.raises(InjectedCrash):
            write_docs(ob, committed, N_DOCS, N_MSGS)
        monkeypatch.undo()
        recover(ob)
        assert isinstance(faulty.inner, InMemoryTransport)
        report = verify_deliveries(committed, faulty.inner.deliveries)
        assert report.ok, report.describe()
        assert report.duplicates == 0  # the watermark made it: nothing pending, nothing re-sent


def test_injected_crash_while_the_worker_holds_commands(
    workspace: Path, clock: ManualClock
) -> None:
    ob, faulty = open_memory(workspace, clock, dispatch="deferred")
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, N_DOCS, N_MSGS)
        crash_points.arm("worker_holding")
        with pytest.raises(InjectedCrash):
            DispatcherWorker(ob.runtime, batch_size=2).run(until_idle=True)
        crash_points.arm("mid_batch", at_hit=2)  # and crash again, during the first recovery
        with pytest.raises(InjectedCrash):
            DispatcherWorker(ob.runtime, batch_size=2).run(until_idle=True)
        clock.advance(ob.settings.lock_duration + 1)  # the dead worker's locks expire
        DispatcherWorker(ob.runtime, batch_size=2).run(until_idle=True)
        assert isinstance(faulty.inner, InMemoryTransport)
        report = verify_deliveries(committed, faulty.inner.deliveries)
        assert report.ok, report.describe()
        assert_all_dispatched(ob, committed)
        assert ob.runtime.queue.stats().get("outbox-commands") is None or (
            ob.runtime.queue.stats()["outbox-commands"].total == 0
        )


def test_rerunning_every_step_only_resends_with_the_same_ids(
    workspace: Path, clock: ManualClock
) -> None:
    """I6: dispatch the same rows again, and run a command for an already-dispatched document."""
    ob, faulty = open_memory(workspace, clock)
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, N_DOCS, N_MSGS)
        _, rows = ob.store.read(list(committed))
        stale = [r for r in rows.values()]
        for r in stale:
            r.dispatched_seq = 0  # as read before the first dispatch
        ob.runtime.dispatcher.dispatch(stale)  # a stale re-run re-sends everything
        ob.runtime.enqueue_commands((i, len(m)) for i, m in committed.items())
        # nothing pending: completes, sends nothing
        DispatcherWorker(ob.runtime).run(until_idle=True)
        assert isinstance(faulty.inner, InMemoryTransport)
        report = verify_deliveries(committed, faulty.inner.deliveries)
        assert report.ok, report.describe()
        assert report.duplicates == N_DOCS * N_MSGS
        assert_all_dispatched(ob, committed)


# --- SIGKILL of real processes ---------------------------------------------------------------


def run_child(target: Callable[..., None], *args: Any) -> int:
    p = children.process(target, *args)
    p.start()
    p.join(120)
    assert not p.is_alive(), "child hung"
    return int(p.exitcode or 0)


@pytest.fixture
def sql_workspace(workspace: Path) -> Path:
    Outbox.open(workspace).close()  # create the table and the SQL schema
    return workspace


@pytest.mark.slow
@pytest.mark.parametrize(
    "crash",
    [
        "after_commit=kill",
        "mid_batch@2=kill",
        "after_send=kill",
        "during_watermark=kill",
        "during_watermark=kill_soon:0.01",
        "during_watermark=kill_soon:0.03",
    ],
)
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_sigkill_of_the_application_process(sql_workspace: Path, crash: str) -> None:
    code = run_child(procs.writer, str(sql_workspace), N_DOCS, N_MSGS, crash, 2)
    assert code == -9 or crash.startswith("during_watermark=kill_soon")
    report, ob = recover_and_verify(sql_workspace)
    with ob:
        assert report.committed > 0
        assert report.ok, report.describe()
        _, rows = ob.store.read([f"pkg{i}" for i in range(N_DOCS)])
        assert all(r.dispatched_seq == r.last_seq for r in rows.values())


@pytest.mark.slow
def test_sigkill_of_a_worker_holding_commands(sql_workspace: Path) -> None:
    with Outbox.open(sql_workspace, default_destination="shipments", dispatch="deferred") as ob:
        write_docs(ob, {}, 6, N_MSGS)
    assert run_child(procs.worker, str(sql_workspace), "worker_holding@2=kill") == -9
    report, ob = recover_and_verify(sql_workspace)
    with ob:
        assert report.committed == 6 * N_MSGS
        assert report.ok, report.describe()

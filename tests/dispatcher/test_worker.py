"""The command worker: settlement by outcome, backoff, dead letters, the CLI, SIGTERM, and several
worker processes sharing one queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher.commands import ProcessDocument
from dispatcher.invariants import verify_deliveries
from dispatcher.queue.messages import QueueMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage
from outbox.testing.faulty import FaultyTransport
from tests import children
from tests.dispatcher import procs
from tests.dispatcher.helpers import write_docs
from tests.dispatcher.recovery import committed_messages, sql_deliveries

#: Seconds a test waits for another thread before calling it hung. Only a hang reaches it:
#: every wait returns as soon as its event comes, so a loaded machine costs nothing.
HANG = 60.0

OUTBOX = str(Path(sys.executable).parent / "outbox")


def deferred(workspace: Path, clock: ManualClock, **kw: object) -> tuple[Outbox, FaultyTransport]:
    faulty = FaultyTransport(InMemoryTransport(), clock=clock)
    ob = Outbox.open(
        workspace,
        clock=clock,
        transport=faulty,
        default_destination="d",
        dispatch="deferred",
        **kw,  # type: ignore[arg-type]
    )
    return ob, faulty


def test_retryable_failure_abandons_with_exponential_backoff(
    workspace: Path, clock: ManualClock
) -> None:
    ob, faulty = deferred(workspace, clock)
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 1, 2)
        faulty.outage()
        worker = DispatcherWorker(ob.runtime, seed=1)
        delays = []
        for _ in range(3):
            start = clock.now()
            assert worker.run(once=True).abandoned == len(delays) + 1
            (peeked,) = ob.runtime.queue.peek("outbox-commands")
            delays.append((peeked.not_before - start).total_seconds())
            clock.set(peeked.not_before)
        assert 1.0 <= delays[0] < 1.2
        assert 2.0 <= delays[1] < 2.4
        assert 4.0 <= delays[2] < 4.8
        faulty.outage(False)
        stats = worker.run(until_idle=True)
        assert stats.completed == 1
        assert verify_deliveries(committed, faulty.inner.deliveries).ok  # type: ignore[attr-defined]


def test_permanent_failure_dead_letters_with_the_reason(
    workspace: Path, clock: ManualClock
) -> None:
    ob, faulty = deferred(workspace, clock)
    with ob:
        write_docs(ob, {}, 2, 1)
        faulty.fail_destination("d", permanent=True)
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert stats.dead_lettered == 2
        (dl, _) = ob.runtime.queue.list_dead_letters("outbox-commands")
        assert dl.reason == "PermanentTransportError"
        assert "destination 'd'" in dl.description


def test_past_max_deliveries_the_command_is_dead_lettered(
    workspace: Path, clock: ManualClock
) -> None:
    ob, faulty = deferred(workspace, clock, max_delivery_count=3)
    with ob:
        write_docs(ob, {}, 1, 1)
        faulty.outage()
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert (stats.abandoned, stats.dead_lettered) == (2, 1)
        (dl,) = ob.runtime.queue.list_dead_letters("outbox-commands")
        assert dl.reason == "MaxDeliveryCountExceeded"
        assert "outage" in dl.description


def test_bad_commands_are_dead_lettered_with_a_reason(workspace: Path, clock: ManualClock) -> None:
    ob, _ = deferred(workspace, clock)
    with ob:
        q = ob.runtime.queue
        q.send("outbox-commands", QueueMessage(body="not json", session_id="x"))
        q.send(
            "outbox-commands",
            ProcessDocument("another-table", "x", 1).to_queue_message(),
        )
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert stats.dead_lettered == 2
        reasons = sorted(d.reason for d in q.list_dead_letters("outbox-commands"))
        assert reasons == ["MalformedCommand", "WrongTable"]


def test_a_command_for_a_missing_document_is_retried_then_dead_lettered(
    workspace: Path, clock: ManualClock
) -> None:
    ob, _ = deferred(workspace, clock, max_delivery_count=2)
    with ob:
        ob.runtime.enqueue_commands([("never-written", 3)])
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert (stats.abandoned, stats.dead_lettered) == (1, 1)
        (dl,) = ob.runtime.queue.list_dead_letters("outbox-commands")
        assert dl.reason == "DocumentNotFound"


def test_a_command_for_a_deleted_incarnation_completes_without_retrying(
    workspace: Path, clock: ManualClock
) -> None:
    """The document was deleted outside the library and created again: its old command (higher
    seq, other incarnation) must not wait for a commit that will never come."""
    ob, faulty = deferred(workspace, clock, max_delivery_count=2)
    with ob:
        write_docs(ob, {}, 1, 1)
        (row,) = ob.store.read(["pkg0"])[1].values()
        ob.runtime.enqueue_commands([("pkg0", row.last_seq + 5, "0" * 32)])
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert (stats.completed, stats.abandoned, stats.dead_lettered) == (2, 0, 0)
        assert len(faulty.inner.deliveries) == 1  # type: ignore[attr-defined]


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_cli_once_drains_and_prints_json(workspace: Path) -> None:
    with Outbox.open(workspace, default_destination="shipments", dispatch="deferred") as ob:
        write_docs(ob, {}, 3, 2)
    out = subprocess.run(
        [OUTBOX, "-w", str(workspace), "run-dispatcher", "--once", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    stats = json.loads(out.stdout)
    assert stats["completed"] == 3
    assert stats["messages_sent"] == 6
    assert "batch: 3 command(s), 6 message(s) sent" in out.stderr


@pytest.mark.slow
def test_sigterm_stops_the_worker_cleanly_with_exit_0(workspace: Path) -> None:
    Outbox.open(workspace).close()
    proc = subprocess.Popen(
        [OUTBOX, "-w", str(workspace), "run-dispatcher", "--poll-interval", "50ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the start-up line: the worker is running
        assert "run-dispatcher" in line
        while "worker ready" not in line:  # the signal handlers are installed from here on
            line = proc.stderr.readline()
            assert line, "the worker exited before it was ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "SIGTERM" in err


@pytest.mark.slow
def test_several_worker_processes_share_one_queue_safely(workspace: Path) -> None:
    with Outbox.open(workspace, default_destination="shipments", dispatch="deferred") as ob:
        for _ in range(2):  # two commits per document: two commands per session
            write_docs(ob, {}, 20, 2)
    workers = [children.process(procs.worker, str(workspace), "", True, 3) for _ in range(3)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(120)
        assert p.exitcode == 0
    with Outbox.open(workspace, create=False) as ob:
        report = verify_deliveries(committed_messages(ob), sql_deliveries(ob))
        assert report.committed == 80
        assert report.ok, report.describe()
        assert report.duplicates == 0  # the SQL transport drops re-sends by message_id
        assert "outbox-commands" not in ob.runtime.queue.stats()  # every command completed
        assert not ob.runtime.queue.list_dead_letters()
        assert ob.store.scan_pending().num_rows == 0
    assert os.environ.get("OUTBOX_CRASH_AT") is None


def test_worker_keeps_its_command_locked_while_a_slow_send_runs(
    workspace: Path, clock: ManualClock
) -> None:
    """60 s of sending on a 30 s lock: the renewer keeps the command, nobody else can take it."""
    import threading
    from collections.abc import Sequence

    from dispatcher.transports.base import TransportMessage

    ob, _ = deferred(workspace, clock)
    queue = ob.runtime.queue
    renewed = threading.Event()
    original = queue.renew_lock

    def spy(m: object) -> object:
        out = original(m)  # type: ignore[arg-type]
        renewed.set()
        return out

    queue.renew_lock = spy  # type: ignore[method-assign]
    stolen: list[object] = []

    class SlowTransport(InMemoryTransport):
        def send(self, batch: Sequence[TransportMessage]) -> None:
            for _ in range(3):
                renewed.clear()
                clock.advance(20)
                assert renewed.wait(HANG), "the command's lock was not renewed"
                stolen.extend(queue.receive("outbox-commands"))
            super().send(batch)

    slow = SlowTransport()
    ob.runtime.dispatcher.transport = slow
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 1, 1)
        stats = DispatcherWorker(ob.runtime, renew_check_interval=0.01).run(once=True)
        assert stolen == []
        assert (stats.completed, stats.lock_lost) == (1, 0)
        assert len(slow.messages()) == 1
        assert queue.stats().get("outbox-commands") is None


# --- errors in the loop (review item 1) and per-batch lock renewal (item 5) -------------------


def test_a_queue_blip_is_retried_not_fatal(workspace: Path, clock: ManualClock) -> None:
    from outbox.core.errors import QueueUnavailableError

    ob, faulty = deferred(workspace, clock)
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 2, 1)
        queue = ob.runtime.queue
        real_receive, real_stats = queue.receive, queue.stats
        blips = {"receive": 2, "stats": 1}

        def flaky(name: str, real: Any) -> Any:
            def call(*a: Any, **kw: Any) -> Any:
                if blips[name]:
                    blips[name] -= 1
                    raise QueueUnavailableError("database is locked")
                return real(*a, **kw)

            return call

        queue.receive = flaky("receive", real_receive)  # type: ignore[method-assign]
        queue.stats = flaky("stats", real_stats)  # type: ignore[method-assign]
        stats = DispatcherWorker(ob.runtime, concurrency=2).run(until_idle=True)
        assert blips == {"receive": 0, "stats": 0}
        assert stats.completed == 2
        assert verify_deliveries(committed, faulty.inner.deliveries).ok  # type: ignore[attr-defined]


def test_a_non_retryable_error_stops_every_thread_and_is_raised(
    workspace: Path, clock: ManualClock
) -> None:
    from outbox.core.errors import QueueError

    ob, _ = deferred(workspace, clock)
    with ob:
        queue = ob.runtime.queue

        def broken(*_a: Any, **_kw: Any) -> Any:
            raise QueueError("permission denied for table outbox_queue_messages")

        queue.receive = broken  # type: ignore[method-assign]
        worker = DispatcherWorker(ob.runtime, concurrency=3)
        with pytest.raises(QueueError, match="permission denied"):
            worker.run()  # without --once: only the error ends it
        assert worker.stopping


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_cli_exits_non_zero_with_one_line_when_the_worker_fails(workspace: Path) -> None:
    with Outbox.open(workspace, default_destination="shipments", dispatch="deferred") as ob:
        write_docs(ob, {}, 1, 1)
    db = workspace / "outbox.db"
    assert db.exists()
    import sqlite3

    with sqlite3.connect(db) as conn:  # the table is gone: not retryable, needs an operator
        conn.execute("DROP TABLE outbox_queue_messages")
    out = subprocess.run(
        [OUTBOX, "-w", str(workspace), "run-dispatcher", "--concurrency", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert "has no outbox tables" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")


def test_an_unexpected_error_abandons_the_whole_batch(workspace: Path, clock: ManualClock) -> None:
    ob, _ = deferred(workspace, clock)
    with ob:
        write_docs(ob, {}, 3, 1)

        def boom(*_a: Any, **_kw: Any) -> Any:
            raise RuntimeError("a bug in the dispatcher")

        ob.runtime.dispatcher.dispatch = boom  # type: ignore[method-assign]
        stats = DispatcherWorker(ob.runtime, batch_size=10).run(once=True)
        assert (stats.commands, stats.abandoned) == (3, 3)
        assert {p.delivery_count for p in ob.runtime.queue.peek("outbox-commands")} == {1}


def test_a_crashed_batch_leaves_nothing_for_the_next_batchs_renewer(
    workspace: Path, clock: ManualClock
) -> None:
    """Each batch's renewer keeps only that batch's unsettled commands."""
    import threading
    from collections.abc import Sequence

    from dispatcher.transports.base import TransportMessage
    from outbox.testing.crash_points import InjectedCrash

    ob, _ = deferred(workspace, clock)
    queue = ob.runtime.queue
    renewed: list[str] = []
    second_renewed = threading.Event()
    original = queue.renew_lock

    def spy(m: Any) -> Any:
        out = original(m)
        renewed.append(m.message_id)
        if m.message_id == second[0].message_id:
            second_renewed.set()
        return out

    queue.renew_lock = spy  # type: ignore[method-assign]

    class SlowTransport(InMemoryTransport):
        def send(self, batch: Sequence[TransportMessage]) -> None:
            clock.advance(20)
            assert second_renewed.wait(HANG), "the second batch's lock was not renewed"
            super().send(batch)

    with ob:
        write_docs(ob, {}, 2, 1)
        worker = DispatcherWorker(ob.runtime, renew_check_interval=0.01)
        first = queue.receive("outbox-commands", 1)
        ob.runtime.crash_points.arm("worker_holding")
        with pytest.raises(InjectedCrash):
            worker.handle_batch(first)
        second = queue.receive("outbox-commands", 1)
        assert len(second) == 1
        assert second[0].session_id != first[0].session_id
        ob.runtime.dispatcher.transport = SlowTransport()
        assert worker.handle_batch(second).completed == 1
        assert first[0].message_id not in renewed


def test_an_idle_worker_cleans_expired_duplicate_ids(workspace: Path, clock: ManualClock) -> None:
    ob, _ = deferred(workspace, clock)
    with ob:
        queue = ob.runtime.queue
        calls: list[int] = []
        original = queue.maybe_forget_expired_duplicates

        def spy() -> int:
            calls.append(1)
            return original()

        queue.maybe_forget_expired_duplicates = spy  # type: ignore[method-assign]
        DispatcherWorker(ob.runtime).run(once=True)
        assert calls == [1]


def test_the_queue_pool_is_sized_for_the_worker(workspace: Path, clock: ManualClock) -> None:
    ob, _ = deferred(workspace, clock)
    with ob:
        DispatcherWorker(ob.runtime, concurrency=12)
        needed = 2 * 12 + ob.settings.max_in_flight
        assert ob.runtime.queue.engine.pool.size() >= needed  # type: ignore[attr-defined]


def test_a_key_gated_by_a_document_another_worker_delivered_passes_on(
    workspace: Path, clock: ManualClock
) -> None:
    """Worker 1 paused key k at A's message and holds B behind it; A's retry went to another
    worker, which delivered it. Worker 1 reads A's row with B's command, sees A's watermark, and
    sends B (without that read, B would wait for A here until dead-lettered)."""
    from dispatcher.command_handler import CommandHandler

    ob, faulty = deferred(workspace, clock)
    with ob:
        for doc in ("A", "B"):  # two commits, one key
            with ob.unit_of_work() as uow:
                uow.create(doc, type="t").send("E", {}, ordering_key="k")
        (a_msg,) = ob.store.read(["A"])[1]["A"].outbox
        (b_msg,) = ob.store.read(["B"])[1]["B"].outbox
        faulty.fail_message(a_msg.message_id)
        worker = DispatcherWorker(ob.runtime, seed=1)
        stats = worker.run(once=True)
        assert stats.abandoned == 2  # A failed, B held behind it
        assert ob.runtime.dispatcher.keys.gates() == {"A"}
        faulty.heal()
        clock.set(max(p.not_before for p in ob.runtime.queue.peek("outbox-commands", 10)))
        # another worker, with a dispatcher of its own, takes A's command and delivers A
        other = Outbox.open(workspace, clock=clock, transport=faulty, dispatch="deferred")
        with other:
            mine = other.runtime.queue.receive("outbox-commands", 1, session_id="A")
            done = CommandHandler(other.runtime, backoff=lambda n: 1.0).handle(mine)
            assert done.completed == 1
        worker.run(until_idle=True)  # only B's command is left
        sent = [m.message_id for m in faulty.inner.deliveries]  # type: ignore[attr-defined]
        assert sent == [a_msg.message_id, b_msg.message_id]
        assert ob.runtime.dispatcher.keys.gates() == set()

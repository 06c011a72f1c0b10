"""Per-key order in the dispatcher (issue 16): within one process, sends of one ordering key are
serialized across documents in the order ``dispatch`` is called; a document left with unsent
messages pauses their keys until the first unsent message is delivered; other keys go on. Across
processes (two dispatchers) nothing of this holds, and a test says so.

The dispatcher is driven directly with rows and a stub watermark store: no Delta table, so each
test takes milliseconds. Nothing sleeps: concurrent dispatches are ordered with events.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dispatcher.dispatch import Dispatcher
from dispatcher.queue.key_lines import MemoryKeyLines, SqlKeyLines
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    PermanentTransportError,
    RetryableTransportError,
    TransportUnavailableError,
)
from outbox.core.model import DocumentRow, OutboxMessage
from outbox.testing.faulty import FaultyTransport

#: Seconds a test waits for another thread before calling it hung. Only a hang reaches it:
#: every wait returns as soon as its event comes, so a loaded machine costs nothing.
HANG = 60.0


class Marks:
    """A watermark store that only records."""

    def __init__(self) -> None:
        self.marks: dict[str, int] = {}

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None:
        for d, s in marks.items():
            self.marks[d] = max(self.marks.get(d, 0), s)
        return 1


def row(doc: str, *keys: str | None, dispatched: int = 0) -> DocumentRow:
    msgs = [
        OutboxMessage(
            seq=i + 1,
            message_id=f"{doc}-{i + 1}",
            destination="q",
            type="T",
            body="{}",
            ordering_key=k,
        )
        for i, k in enumerate(keys)
    ]
    return DocumentRow(doc, "t", 1, {}, len(msgs), dispatched, msgs)


class Flaky(InMemoryTransport):
    """Fails sends that carry a message id in ``failing``; optionally blocks on ``gate``."""

    atomic_batches = False  # one document per send: the per-document path

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()
        self.gates: dict[str, tuple[threading.Event, threading.Event]] = {}
        self.arrived: dict[str, threading.Event] = {}  # set once that message is delivered

    def send(self, batch: Sequence[TransportMessage]) -> None:
        for m in batch:
            if m.message_id in self.gates:
                entered, release = self.gates[m.message_id]
                entered.set()
                assert release.wait(HANG)
            if m.message_id in self.failing:
                raise RetryableTransportError("broker busy", message_id=m.message_id)
        super().send(batch)
        for m in batch:
            self.arrived.setdefault(m.message_id, threading.Event()).set()


def sent(t: InMemoryTransport) -> list[str]:
    return [m.message_id for m in t.deliveries]


def test_a_failed_send_pauses_its_key_across_documents_until_delivered() -> None:
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    report = d.dispatch([row("A", "customer-7", "customer-7")])
    assert report.failed == ["A"]
    # B shares the key: it must not overtake A-1; C has its own key and goes on
    report = d.dispatch([row("B", "customer-7"), row("C", "customer-9")])
    assert sent(t) == ["C-1"]
    assert sorted(report.failed) == ["B"]
    assert "paused until message A-1" in str(report.outcomes["B"].error)
    t.failing = set()
    d.dispatch([row("B", "customer-7")])  # a retry of B alone: still held back
    assert sent(t) == ["C-1"]
    d.dispatch([row("A", "customer-7", "customer-7")])  # the retry path delivers A-1: resumed
    d.dispatch([row("B", "customer-7")])
    assert sent(t) == ["C-1", "A-1", "A-2", "B-1"]
    assert d.keys.paused() == {}


def test_a_document_deleted_and_created_again_is_not_held_back_by_its_old_life() -> None:
    """Its old life's paused message will never be delivered; the new life's seq 1 (another
    message id) must not wait for it, or the key stops for good and its commands dead-letter."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    old = row("A", "k")
    t.failing = {"A-1"}
    d.dispatch([old])
    assert d.keys.paused()
    t.failing = set()
    reborn = row("A", "k")
    reborn.outbox[0] = dataclasses.replace(reborn.outbox[0], message_id="A-1-reborn")
    reborn = dataclasses.replace(reborn, incarnation="second-life")
    report = d.dispatch([reborn])
    assert report.failed == []
    assert sent(t) == ["A-1-reborn"]
    assert d.keys.paused() == {}


def test_the_keys_of_every_unsent_message_wait() -> None:
    """A document stopped at its first message leaves a message of another key unsent: that key
    is paused too, or another document's later message of it would overtake it."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    d.dispatch([row("A", "x", "y")])
    d.dispatch([row("B", "y")])
    assert sent(t) == []
    t.failing = set()
    d.dispatch([row("A", "x", "y"), row("B", "y")])
    assert sent(t) == ["A-1", "A-2", "B-1"]


def test_a_key_resumes_when_a_watermark_shows_its_message_delivered_elsewhere() -> None:
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    d.dispatch([row("A", "k")])
    t.failing = set()
    d.dispatch([row("B", "k")])
    assert sent(t) == []
    # a worker elsewhere delivered A-1: the next rows for A carry its watermark
    d.dispatch([row("A", "k", dispatched=1), row("B", "k")])
    assert sent(t) == ["B-1"]


def test_resume_by_hand_after_giving_up_on_the_paused_message() -> None:
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    d.dispatch([row("A", "k")])
    assert d.resume("q", "k") is True
    d.dispatch([row("B", "k")])
    assert sent(t) == ["B-1"]
    assert d.resume("q", "k") is False


def test_sends_of_one_key_follow_dispatch_order_across_threads() -> None:
    """A (called first) is slow in the broker; B (same key, called second, another thread) waits
    for it; C (another key) is not held up by A."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=4)
    entered, release = threading.Event(), threading.Event()
    t.gates["A-1"] = (entered, release)
    first = threading.Thread(target=d.dispatch, args=([row("A", "k")],))
    first.start()
    assert entered.wait(HANG)  # A holds its turn inside the broker call
    second = threading.Thread(target=d.dispatch, args=([row("B", "k"), row("C", "other")],))
    second.start()
    assert t.arrived.setdefault("C-1", threading.Event()).wait(HANG)  # C goes on without A
    assert sent(t) == ["C-1"]  # B waits for A's turn to end
    release.set()
    first.join(HANG)
    second.join(HANG)
    assert sent(t) == ["C-1", "A-1", "B-1"]


def test_coalesced_batches_keep_the_pause() -> None:
    failing = Flaky()
    d = Dispatcher(Marks(), failing, max_in_flight=1, coalesce=True)
    failing.failing = {"A-1"}
    d.dispatch([row("A", "k")])
    failing.failing = set()
    d.dispatch([row("B", "k"), row("C", "j")])  # B held behind A-1, C goes on
    assert sent(failing) == ["C-1"]
    d.dispatch([row("B", "k"), row("D", "j")])  # B still held, in a coalescing dispatcher
    assert sent(failing) == ["C-1", "D-1"]


class Down(InMemoryTransport):
    """A broker that is down (every send fails retryably) or refuses one message for good."""

    def __init__(self, *, coalesce: bool) -> None:
        super().__init__()
        self.coalesce_sends = coalesce
        self.atomic_batches = False
        self.calls = 0
        self.down = True
        self.refuse: set[str] = set()

    def send(self, batch: Sequence[TransportMessage]) -> None:
        self.calls += 1
        if self.down:
            raise TransportUnavailableError("timed out", message_id=batch[0].message_id)
        if refused := [m.message_id for m in batch if m.message_id in self.refuse]:
            raise PermanentTransportError("too large", message_id=refused[0])
        super().send(batch)


def test_a_dispatch_during_an_outage_makes_one_send_whatever_its_size() -> None:
    """Issue 42: after a coalesced send failed, each document was sent again on its own, each
    waiting out the broker's timeout: (documents + 1) timeouts on the caller's path. One failed
    send to a destination now fails the rest of the dispatch to it at once (a retry command
    sends them), coalesced or not."""
    for coalesce in (True, False):
        t = Down(coalesce=coalesce)
        d = Dispatcher(Marks(), t, max_in_flight=1)
        report = d.dispatch([row(f"D{i}", f"k{i}") for i in range(10)])
        assert sorted(report.failed) == sorted(f"D{i}" for i in range(10))
        assert t.calls == 1, coalesce


def test_a_refused_message_in_a_coalesced_send_holds_back_only_its_document() -> None:
    t = Down(coalesce=True)
    t.down = False
    t.refuse = {"B-1"}
    d = Dispatcher(Marks(), t, max_in_flight=1)
    report = d.dispatch([row("A", "a"), row("B", "b"), row("C", "c")])
    assert report.failed == ["B"]
    assert report.outcomes["B"].permanent
    assert sent(t) == ["A-1", "C-1"]


def test_with_lines_in_memory_a_pause_holds_only_its_own_process() -> None:
    """Two dispatchers with lines in memory (``MemoryKeyLines``, the default without a shared
    store) stand for two processes sharing a key: the pause of one does not stop the other.
    Sharing a ``KeyLines`` store is what makes it hold (the test below)."""
    t = Flaky()
    one, two = Dispatcher(Marks(), t), Dispatcher(Marks(), t)
    t.failing = {"A-1"}
    one.dispatch([row("A", "k")])
    two.dispatch([row("B", "k")])
    assert sent(t) == ["B-1"]


def test_doc_send_accepts_an_empty_body(outbox: Outbox, memory: InMemoryTransport) -> None:
    """docs/dispatcher.md: an empty body is a signal like any other; doc.send does not refuse it."""
    with outbox.unit_of_work() as uow:
        doc = uow.create("d-1", type="t")
        doc.send("Ping", "", headers={"kind": "signal"})
        doc.send("Pong", b"")
    assert [(m.subject, m.body) for m in memory.deliveries] == [("Ping", b""), ("Pong", b"")]


def test_held_documents_of_a_key_go_out_in_commit_order_after_a_resume() -> None:
    """Issue 29: A's send fails, so B and C (same key, committed after A, in that order) are
    held. Their retries reach the dispatcher as A, C, B: C must wait for B, as Pub/Sub's
    publisher does with messages on hold."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    for doc in "ABC":
        d.dispatch([row(doc, "k")])
    assert sent(t) == []
    assert [h.doc_id for h in d.keys.held()[("q", "k")]] == ["B", "C"]
    t.failing = set()
    d.dispatch([row("A", "k")])
    report = d.dispatch([row("C", "k")])  # C's retry came first: it waits for B
    assert report.failed == ["C"]
    assert "paused until message B-1" in str(report.outcomes["C"].error)
    d.dispatch([row("B", "k")])
    d.dispatch([row("C", "k")])
    assert sent(t) == ["A-1", "B-1", "C-1"]
    assert d.keys.paused() == {}
    assert d.keys.held() == {}


def test_a_held_document_delivered_elsewhere_leaves_the_line() -> None:
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    for doc in "ABC":
        d.dispatch([row(doc, "k")])
    t.failing = set()
    # another process delivered A-1 and B-1: their watermarks say so
    d.dispatch([row("A", "k", dispatched=1), row("B", "k", dispatched=1)])
    d.dispatch([row("C", "k")])
    assert sent(t) == ["C-1"]
    assert d.keys.paused() == {}


def test_resume_by_hand_passes_the_gate_to_the_first_held_document() -> None:
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    for doc in "ABC":
        d.dispatch([row(doc, "k")])
    assert d.resume("q", "k", "A-1") is True  # A-1 given up on: B is next, then C
    d.dispatch([row("C", "k")])
    d.dispatch([row("B", "k")])
    d.dispatch([row("C", "k")])
    assert sent(t) == ["B-1", "C-1"]


def test_resume_is_idempotent_for_one_pause() -> None:
    """Issue 42: a second resume gave up on the next held document's gate too. Pub/Sub calls
    resume from each failed publish's callback; here that skipped gates and broke the order. A
    resume names the gate it gives up on; a repeat finds it passed and does nothing."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    for doc in "ABC":
        d.dispatch([row(doc, "k")])
    assert d.resume("q", "k", "A-1") is True
    assert d.resume("q", "k", "A-1") is False
    assert d.keys.paused()[("q", "k")].message_id == "B-1"
    d.dispatch([row("C", "k")])  # still behind B
    assert sent(t) == []
    # without a message id, resume opens the key: repeats find it open
    assert d.resume("q", "k") is True
    assert d.resume("q", "k") is False
    d.dispatch([row("C", "k")])
    assert sent(t) == ["C-1"]


def test_one_dispatch_sends_a_keys_documents_in_the_order_they_were_written() -> None:
    """A worker's batch reads its documents in the store's order, not the commit order: the
    rows of one dispatch go out by when their messages were written."""
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(6):
        r = row(f"key-0/{i}", "key-0")
        r.outbox[0] = dataclasses.replace(r.outbox[0], created_at=t0 + timedelta(seconds=i))
        rows.append(r)
    for coalesce in (False, True):
        t = Flaky()
        d = Dispatcher(Marks(), t, max_in_flight=4, coalesce=coalesce)
        d.dispatch([rows[i] for i in (5, 4, 0, 3, 1, 2)])
        assert sent(t) == [f"key-0/{i}-1" for i in range(6)], coalesce


def test_random_failures_and_retry_order_keep_a_keys_commit_order() -> None:
    """The worker's situation, driven directly: documents of one key committed in order, sends
    failing at random, retries reaching the dispatcher in random order until everything is
    delivered. First deliveries follow the commit order (seeded, so a failure reproduces)."""
    import random

    for seed in range(30):
        rng = random.Random(seed)
        t = Flaky()
        d = Dispatcher(Marks(), t, max_in_flight=1)
        docs = [f"D{i}" for i in range(8)]
        delivered: set[str] = set()
        pending = list(docs)
        for doc in docs:  # the commits, each dispatched right after it
            t.failing = {f"{doc}-1"} if rng.random() < 0.4 else set()
            d.dispatch([row(doc, "k")])
        for _ in range(500):
            delivered = {m.split("-")[0] for m in sent(t)}
            pending = [x for x in docs if x not in delivered]
            if not pending:
                break
            doc = rng.choice(pending)
            t.failing = {f"{doc}-1"} if rng.random() < 0.3 else set()
            d.dispatch([row(doc, "k")])
        assert not pending, seed
        first = list(dict.fromkeys(sent(t)))
        assert first == [f"{x}-1" for x in docs], (seed, first)


def test_the_gates_own_later_message_waits_behind_documents_held_before_it() -> None:
    """Issue 42: A-1 failed, so B-1 (committed next) was held behind it; A-2, committed after
    B-1, went out with A-1, ahead of B-1. Only the gate's run leaves with the gate: A-2 waits
    behind B."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    d.dispatch([row("A", "k")])  # A-1 fails: k paused at A-1
    d.dispatch([row("B", "k")])  # B-1 held behind it
    t.failing = set()
    d.dispatch([row("A", "k", "k")])  # A-2 committed: A-1 goes, A-2 waits behind B
    assert sent(t) == ["A-1"]
    d.dispatch([row("B", "k")])
    d.dispatch([row("A", "k", "k", dispatched=1)])
    assert sent(t) == ["A-1", "B-1", "A-2"]
    assert d.keys.paused() == {}


def test_the_issues_reproduction_through_the_outbox_and_the_worker(
    workspace: Path, clock: ManualClock
) -> None:
    """The issue's program: the transport down for two commits on key K, up for A's second;
    the worker sends the rest. Committed A-1, B-1, A-2; delivered (first) in that order."""
    inner = InMemoryTransport()
    faulty = FaultyTransport(inner, clock=clock)
    with Outbox.open(workspace, clock=clock, transport=faulty, default_destination="q") as ob:
        faulty.outage()
        with ob.unit_of_work() as uow:
            uow.create("A", type="T").send("E", "A-1", ordering_key="K")
        with ob.unit_of_work() as uow:
            uow.create("B", type="T").send("E", "B-1", ordering_key="K")
        faulty.heal()
        with ob.unit_of_work() as uow:
            doc = uow.get("A")
            assert doc is not None
            doc.send("E", "A-2", ordering_key="K")
        drain_commands(ob, clock)
    firsts = list(dict.fromkeys(m.body.decode() for m in inner.deliveries))
    assert firsts == ["A-1", "B-1", "A-2"]


def drain_commands(ob: Outbox, clock: ManualClock, rounds: int = 20) -> None:
    """Run the command worker until no command is left, moving the clock to each retry's time
    (the commands of failed sends are scheduled, and abandons back off)."""
    worker = DispatcherWorker(ob.runtime, poll_interval=0.0)
    for _ in range(rounds):
        worker.run(once=True)
        waiting = ob.runtime.queue.peek(ob.settings.command_queue, 100)
        if not waiting:
            return
        clock.set(max(clock.now(), *(m.not_before for m in waiting)))
    raise AssertionError(f"commands still waiting after {rounds} rounds")


@contextmanager
def sqlite_shared_lines(folder: Path) -> Iterator[Callable[[], SqlKeyLines]]:
    """Lines on one SQLite file in ``folder``, a connection each time the returned callable is
    called: two dispatchers sharing them are two processes sharing the queue database."""
    from dispatcher.queue.database import Database, open_engine
    from migrations.sql import upgrade

    url = f"sqlite:///{folder / 'q.db'}"
    upgrade(url)
    dbs: list[Database] = []

    def make() -> SqlKeyLines:
        dbs.append(Database(open_engine(url), owned=True))
        return SqlKeyLines(dbs[-1])

    try:
        yield make
    finally:
        for db in dbs:
            db.close()


@pytest.fixture(params=["memory", "sqlite"])
def shared_lines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Lines two dispatchers share, as two processes share the queue database: one object in
    memory, or two connections to one SQLite file."""
    if request.param == "memory":
        one = MemoryKeyLines()
        yield lambda: one
        return
    with sqlite_shared_lines(tmp_path) as make:
        yield make


def test_a_pause_holds_every_dispatcher_that_shares_the_lines(
    shared_lines: Callable[[], Any],
) -> None:
    """Issue 42: the writer paused K and held B; B's retry reached the command worker (another
    process) first, which knew nothing of the writer's line and sent B-1 ahead of A-1. With the
    lines shared, the worker holds B, sends A-1 when A's retry comes, then B; and the writer
    sees the key open again."""
    t = Flaky()
    writer = Dispatcher(Marks(), t, max_in_flight=1, key_lines=shared_lines())
    worker = Dispatcher(Marks(), t, max_in_flight=1, key_lines=shared_lines())
    t.failing = {"A-1"}
    writer.dispatch([row("A", "k")])
    writer.dispatch([row("B", "k")])
    t.failing = set()
    report = worker.dispatch([row("B", "k")])  # B's retry first: held in the worker too
    assert report.failed == ["B"]
    assert sent(t) == []
    worker.dispatch([row("A", "k")])
    worker.dispatch([row("B", "k")])
    assert sent(t) == ["A-1", "B-1"]
    writer.dispatch([row("C", "k")])  # the writer's next commit: the key is open again
    assert sent(t) == ["A-1", "B-1", "C-1"]
    assert writer.keys.paused() == {} == worker.keys.paused()


def test_a_document_held_behind_a_gate_passed_in_the_same_dispatch_goes_in_it() -> None:
    """A worker's batch holds B and A, and B comes first (their messages written in one
    instant): B is held behind A-1, A-1 goes, and B goes in the same dispatch."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1)
    t.failing = {"A-1"}
    d.dispatch([row("A", "k")])
    d.dispatch([row("B", "k")])
    t.failing = set()
    report = d.dispatch([row("B", "k"), row("A", "k")])
    assert sent(t) == ["A-1", "B-1"]
    assert report.failed == []
    assert report.messages_sent == 2
    assert d.keys.paused() == {}


class StoreDown(MemoryKeyLines):
    """Shared lines whose every call fails while ``down`` (the queue's database locked)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise OSError("database is locked")

    def paused_among(self, keys: Any) -> Any:
        self._check()
        return super().paused_among(keys)

    def hold(self, waits: Any, reason: str, at: Any) -> Any:
        self._check()
        return super().hold(waits, reason, at)

    def remove(self, key: Any, entry_ids: Any, up_to: Any = None) -> Any:
        self._check()
        return super().remove(key, entry_ids, up_to)

    def lines(self, limit: int | None = None) -> Any:
        self._check()
        return super().lines(limit)


def test_a_hold_made_while_the_store_failed_outlives_its_return() -> None:
    """The failure that stops A-1 (the queue's database) also fails its hold: A-1 is held in
    this process's view only. When the database answers again, the next dispatch's read used to
    replace the view and forget it, and B-1 went out ahead of A-1 (a review found it). The hold
    is written to the store first, and B-1 waits."""
    lines = StoreDown()
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1, key_lines=lines)
    t.failing, lines.down = {"A-1"}, True
    d.dispatch([row("A", "k")])
    lines.down = False
    d.dispatch([row("B", "k")])
    assert sent(t) == []
    assert [h.doc_id for h in lines.lines()[("q", "k")]] == ["A", "B"]
    t.failing = set()
    d.dispatch([row("A", "k"), row("B", "k")])
    assert sent(t) == ["A-1", "B-1"]


class RemovalFails(StoreDown):
    """Reads work; removing a hold fails (SQLite's writer lock busy)."""

    def remove(self, key: Any, entry_ids: Any, up_to: Any = None) -> Any:
        raise OSError("database is locked")


def test_a_resume_by_hand_that_cannot_be_written_fails() -> None:
    """``outbox keys resume --skip`` printed that the gate was given up on, exit 0, when the
    store's write failed (the error was swallowed as for the dispatch's own removals)."""
    lines = RemovalFails()
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1, key_lines=lines)
    t.failing = {"A-1"}
    d.dispatch([row("A", "k")])
    with pytest.raises(OSError, match="database is locked"):
        d.resume("q", "k", "A-1")
    assert [h.message_id for h in lines.lines()[("q", "k")]] == ["A-1"]

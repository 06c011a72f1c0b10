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
from collections.abc import Mapping, Sequence

from dispatcher.dispatch import Dispatcher
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from outbox.app.facade import Outbox
from outbox.core.errors import RetryableTransportError
from outbox.core.model import DocumentRow, OutboxMessage

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
    d.dispatch([row("A", "k"), row("B", "k"), row("C", "j")])
    assert sent(failing) == ["C-1"]
    failing.failing = set()
    d.dispatch([row("B", "k"), row("D", "j")])  # B still held, in a coalescing dispatcher
    assert sent(failing) == ["C-1", "D-1"]


def test_across_processes_a_pause_holds_nothing() -> None:
    """Two dispatchers stand for two application processes sharing a key: the pause of one does
    not stop the other, so the other's later message overtakes (documented, not prevented)."""
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
    assert d.resume("q", "k") is True  # A-1 given up on: B is next, then C
    d.dispatch([row("C", "k")])
    d.dispatch([row("B", "k")])
    d.dispatch([row("C", "k")])
    assert sent(t) == ["B-1", "C-1"]


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

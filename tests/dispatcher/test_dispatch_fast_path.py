"""The dispatch's per-message shortcuts (issue 45, P2c) keep their guarantees: one turn entry per
send still orders a key across documents and dispatches (I2); the sort skipped when every key is
its own document's is never skipped for a shared key (I2); a shared send recorded whole marks
only what the transport took (I1/I6); shared sends of a coalescing transport that is not atomic
overlap, never two of one key.

Driven directly with rows and a stub watermark store, as tests/dispatcher/test_key_order.py.
Nothing sleeps: a thread's progress is seen through events (a send arriving, a thread waiting
for its turn), each wait bounded only against a hang.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatcher.dispatch import Dispatcher, KeyPausedError
from dispatcher.keys import KeyOrder
from dispatcher.outcomes import DispatchReport, DocumentOutcome
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from tests.dispatcher.test_key_order import HANG, Down, Flaky, Marks, row, sent
from tests.mutate import mutated


def _written(r: Any, second: int) -> Any:
    """``r`` with its messages written ``second`` seconds into the day."""
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second)
    r.outbox[:] = [dataclasses.replace(m, created_at=at) for m in r.outbox]
    return r


# --- turns: one entry per send -----------------------------------------------------------------


def test_a_ticket_is_first_in_line_unless_an_earlier_one_in_flight_shares_a_key() -> None:
    order = KeyOrder()
    first = order.take(frozenset({("q", "a"), ("q", "b")}))
    second = order.take(frozenset({("q", "b")}))
    third = order.take(frozenset({("q", "c")}))
    assert [order.my_turn(t) for t in (first, second, third)] == [True, False, True]
    order.release(first)
    assert order.my_turn(second)
    order.release(second)
    order.release(second)  # a repeat (a cancelled send's) changes nothing
    assert order.my_turn(third)


class Watched(threading.Condition):
    """The key order's condition, telling when a thread starts waiting for its turn."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_dispatch_on_a_key_another_document_holds_waits_while_its_send_is_in_the_broker() -> None:
    """A and X share one coalesced send (keys k1, k2); the broker holds it. B (key k2, another
    dispatch, another thread) must wait for that send's turn to end: it starts waiting, and only
    after the release does B-1 leave, after X-1."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=4, coalesce=True)
    progressed = threading.Event()  # B waits for its turn, or (broken) B-1 arrived
    d.keys._cond = Watched(progressed)
    entered, release = threading.Event(), threading.Event()
    t.gates["A-1"] = (entered, release)
    t.arrived["B-1"] = progressed
    first = threading.Thread(target=d.dispatch, args=([row("A", "k1"), row("X", "k2")],))
    second = threading.Thread(target=d.dispatch, args=([row("B", "k2")],))
    first.start()
    try:
        assert entered.wait(HANG)
        second.start()
        assert progressed.wait(HANG)
        assert sent(t) == []  # B-1 did not overtake X-1, held in the broker
    finally:  # a failure leaves no thread behind in the broker
        release.set()
        first.join(HANG)
        if second.ident is not None:
            second.join(HANG)
        d.close()
    assert sent(t) == ["A-1", "X-1", "B-1"]


# --- the order between documents: sorted when a key may span them --------------------------------


def test_a_session_named_after_another_document_keeps_the_written_order() -> None:
    """B's message has the session "A", which is also A's own key (A sends without one): the two
    share a key, so B-1 (written first) leaves first whatever order the rows come in."""
    for coalesce in (False, True):
        t = Flaky()
        d = Dispatcher(Marks(), t, max_in_flight=1, coalesce=coalesce)
        d.dispatch([_written(row("A", None), 2), _written(row("B", "A"), 1)])
        d.close()
        assert sent(t) == ["B-1", "A-1"], coalesce


def test_documents_with_keys_of_their_own_keep_the_order_they_came_in() -> None:
    """No sort when no key spans documents: the rows go as they came (nothing to order)."""
    t = Flaky()
    d = Dispatcher(Marks(), t, max_in_flight=1, coalesce=True)
    d.dispatch([_written(row("A", None), 2), _written(row("B", "B"), 1)])
    d.close()
    assert sent(t) == ["A-1", "B-1"]


# --- a shared send recorded whole ----------------------------------------------------------------


def test_a_shared_send_that_took_everything_reports_as_outcomes_one_by_one() -> None:
    marks = Marks()
    t = InMemoryTransport()
    d = Dispatcher(marks, t, max_in_flight=1)
    rows = [row("A", None, None), row("B", None, None, dispatched=1), row("C", None)]
    report = d.dispatch(rows)
    d.close()
    assert report.messages_sent == 4
    assert report.failed == []
    assert report.ok
    assert report.tally() == (3, 0)
    assert report.outcomes == {
        "A": DocumentOutcome("A", 0, 2, 2),
        "B": DocumentOutcome("B", 1, 2, 2),
        "C": DocumentOutcome("C", 0, 1, 1),
    }
    assert marks.marks == {"A": 2, "B": 2, "C": 1}
    assert t.sends == 1


def test_a_document_held_back_then_sent_whole_keeps_where_it_started() -> None:
    """A later round's whole send goes on from the first round's outcome: its start (and so
    ``progressed``) is the first's, and its messages are counted once."""
    report = DispatchReport()
    b = row("B", "k", "k")
    report.record(DocumentOutcome("B", 0, 2, 1, KeyPausedError("held")), b)
    report.sent_whole([(dataclasses.replace(b, dispatched_seq=1), b.outbox[1:])])
    assert report.messages_sent == 2
    assert report.outcomes["B"] == DocumentOutcome("B", 0, 2, 2)
    assert report.failed == []
    report.watermark_error = OSError("the marks were not written")
    assert report.failed == ["B"]


def test_a_whole_send_whose_watermark_failed_names_its_documents() -> None:
    report = DispatchReport()
    a, b = row("A", None), row("B", None)
    report.sent_whole([(a, a.outbox), (b, b.outbox)])
    assert report.failed == []
    assert report.tally() == (2, 0)
    assert report.marks([]) == {"A": (1, None), "B": (1, None)}
    report.watermark_error = OSError("the marks were not written")
    assert report.failed == ["A", "B"]


def test_a_refused_message_in_a_shared_send_marks_only_what_the_transport_took() -> None:
    """The shared send fails on B-1; A and C go on their own and are marked; B is not (I1)."""
    marks = Marks()
    t = Down(coalesce=True)
    t.down = False
    t.refuse = {"B-1"}
    d = Dispatcher(marks, t, max_in_flight=1)
    report = d.dispatch([row("A", "a"), row("B", "b"), row("C", "c")])
    d.close()
    assert marks.marks == {"A": 1, "C": 1}
    assert report.failed == ["B"]
    assert report.messages_sent == 2


# --- overlapping shared sends (coalescing, not atomic) -------------------------------------------


class Overlapping(InMemoryTransport):
    """Coalesces, not atomic (Kafka's capabilities). The first send stays in the broker until
    something happens (``progress``: a second send arrives, or a send is seen waiting for its
    turn) or ``wait`` passes, then records whether a second send came meanwhile."""

    atomic_batches = False
    coalesce_sends = True

    def __init__(self, wait: float) -> None:
        super().__init__()
        self.wait = wait
        self.progress = threading.Event()
        self.second = threading.Event()
        self.overlapped: bool | None = None
        self.batches: list[list[str]] = []
        self._calls = threading.Lock()

    def send(self, batch: Sequence[TransportMessage]) -> None:
        with self._calls:
            self.batches.append([m.message_id for m in batch])
            first = len(self.batches) == 1
        if first:
            self.progress.wait(self.wait)
            self.overlapped = self.second.is_set()
        else:
            self.second.set()
            self.progress.set()
        super().send(batch)


def _overlap(wait: float, *, shared_key: bool) -> Overlapping:
    """500 documents of one message: two shared sends of 250 (``max_batch_messages``); with
    ``shared_key`` the first and the 251st document share a session."""
    t = Overlapping(wait)
    d = Dispatcher(Marks(), t, max_in_flight=4, max_batch_messages=250)
    d.keys._cond = Watched(t.progress)
    rows = [row(f"d{i:03}", None) for i in range(500)]
    if shared_key:
        rows[0], rows[250] = row("d000", "k"), row("d250", "k")
    report = d.dispatch(rows)
    d.close()
    assert report.messages_sent == 500
    assert report.ok
    return t


def check_shared_sends_overlap(wait: float = HANG) -> None:
    t = _overlap(wait, shared_key=False)
    assert len(t.batches) == 2
    assert t.overlapped is True


def test_shared_sends_of_a_transport_that_is_not_atomic_overlap() -> None:
    check_shared_sends_overlap()


def test_overlapping_shared_sends_never_carry_one_key_at_once() -> None:
    """The second send holds the key "k" of the first: it waits for its turn (seen waiting),
    never in the broker beside it."""
    t = _overlap(HANG, shared_key=True)
    assert len(t.batches) == 2
    assert t.overlapped is False
    assert t.batches[0][0] == "d000-1"
    assert t.batches[1][0] == "d250-1"


def test_without_overlap_the_shared_sends_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local mutation: atomic or not, shared sends one at a time (the slot SQLite needs):
    the overlap test fails (its wait is short here: the second send can never come)."""
    cls, attr, broken = mutated(
        "dispatcher.dispatch:Dispatcher._run_in_line",
        (("if self.atomic and len(chunk) > 1:", "if len(chunk) > 1:"),),
    )
    monkeypatch.setattr(cls, attr, broken)
    with pytest.raises(AssertionError):
        check_shared_sends_overlap(wait=0.2)

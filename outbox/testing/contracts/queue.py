"""The queue contract: every Service-Bus-like semantic the outbox relies on (docs/sql_queue.md):
duplicate detection, session FIFO with one holder, scheduled delivery, peek-lock
settlement, delivery counts and dead letters.

Why it ships: the dispatcher worker and the rescuer trust these semantics blindly, so a queue
backend (another database, a broker adapter) is only a drop-in when it passes them all. Subclass
``QueueContract``, implement ``make_queue`` (honouring the limits below) and ``reopen_queue``, and
set to False the ``supports_*`` flags your backend does not claim: those tests skip.

Time only moves when a test advances the ``ManualClock`` handed to ``make_queue``; nothing sleeps.
The queue under test needs ``SqlQueue``'s public surface (send, receive, complete, abandon, ...).

Why one module: the contract is one class a backend subclasses, one short test per semantic;
splitting it into mixins would make a third party assemble the suite and risk missing a part.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from dispatcher.queue.messages import QueueMessage, ReceivedMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import ClosedError, LockLostError, MessageNotFoundError, ValidationError

#: The limits ``make_queue`` must configure; the tests count on them.
LOCK_DURATION = 30.0
MAX_DELIVERY_COUNT = 3
DUPLICATE_DETECTION_WINDOW = 600.0
MAX_BODY_BYTES = 1024


def msg(mid: str, session: str | None = None, **kw: object) -> QueueMessage:
    return QueueMessage(body=f"body-{mid}".encode(), message_id=mid, session_id=session, **kw)  # type: ignore[arg-type]


def ids(messages: list[ReceivedMessage]) -> list[str]:
    return [m.message_id for m in messages]


def _settle(queue: Any, m: ReceivedMessage, action: str) -> None:
    if action == "dead_letter":
        queue.dead_letter(m, "R")
    else:
        getattr(queue, action)(m)


def _dead(queue: Any, *pairs: tuple[str, str]) -> None:
    for mid, reason in pairs:
        queue.send("q", msg(mid))
        [m] = queue.receive("q")
        queue.dead_letter(m, reason)


class QueueContract:
    """Subclass as ``Test<YourQueue>``; override ``make_queue`` (and ``reopen_queue``)."""

    #: session FIFO with one lock holder per session, and ``receive(session_id=...)``
    supports_sessions = True
    #: ``not_before`` and ``abandon(delay=...)``
    supports_scheduled_delivery = True
    #: ``receive_and_delete``
    supports_receive_and_delete = True
    #: ``get_dead_letter``, ``count_dead_letters``, ``requeue`` and ``purge``
    supports_dead_letter_admin = True
    #: ``forget_expired_duplicates`` (housekeeping of the duplicate-detection ids)
    supports_duplicate_cleanup = True
    #: ``reopen_queue``: a second instance over the same storage sees the same messages
    supports_reopen = True
    #: ``defer`` and ``receive_deferred`` (the fourth peek-lock settlement)
    supports_defer = True
    #: ``stats()`` counts deferred messages apart (Service Bus's runtime properties do not)
    supports_deferred_count = True

    def make_queue(self, clock: ManualClock) -> Any:
        """A fresh, empty queue on ``clock``, configured with ``LOCK_DURATION``,
        ``MAX_DELIVERY_COUNT``, ``DUPLICATE_DETECTION_WINDOW`` and ``MAX_BODY_BYTES``."""
        raise NotImplementedError

    def reopen_queue(self) -> Any:
        """Another instance over the storage of the last ``make_queue`` (defaults are fine)."""
        raise NotImplementedError

    def require(self, *features: str) -> None:
        """Skip the running test unless the backend claims every ``supports_<feature>``."""
        for feature in features:
            if not getattr(self, f"supports_{feature}"):
                pytest.skip(f"the backend does not claim {feature} (supports_{feature} = False)")

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def queue(self, clock: ManualClock) -> Iterator[Any]:
        q = self.make_queue(clock)
        yield q
        q.close()

    def test_send_then_receive_carries_every_field(self, queue: Any, clock: ManualClock) -> None:
        queue.send(
            "orders",
            QueueMessage(
                body="héllo",
                message_id="m1",
                session_id="s1",
                subject="OrderPlaced",
                content_type="text/plain",
                correlation_id="c1",
                headers={"traceparent": "00-abc", "n": 3},
            ),
        )
        [got] = queue.receive("orders")
        assert got.message_id == "m1"
        assert got.text == "héllo"
        assert (got.session_id, got.subject, got.content_type, got.correlation_id) == (
            "s1",
            "OrderPlaced",
            "text/plain",
            "c1",
        )
        assert got.headers == {"traceparent": "00-abc", "n": 3}
        assert got.delivery_count == 1
        assert got.enqueued_at == clock.now()
        assert got.locked_until == clock.now() + timedelta(seconds=30)
        assert got.lock_token is not None

    def test_send_is_durable_across_instances(self, queue: Any) -> None:
        self.require("reopen")
        queue.send("q", [msg("a"), msg("b")])
        other = self.reopen_queue()
        try:
            assert [p.message_id for p in other.peek("q")] == ["a", "b"]
        finally:
            other.close()

    def test_generated_message_ids_are_unique(self, queue: Any) -> None:
        sent = queue.send("q", [QueueMessage(b"x"), QueueMessage(b"x")])
        assert len(set(sent)) == 2

    def test_batch_is_atomic_when_one_message_is_invalid(self, queue: Any) -> None:
        with pytest.raises(ValidationError, match="bad"):
            queue.send("q", [msg("ok"), QueueMessage(b"x" * 2000, message_id="bad")])
        assert queue.peek("q") == []

    @pytest.mark.parametrize("empty", [b"", "", None], ids=["bytes", "str", "None"])
    def test_empty_body_is_an_ordinary_message(self, queue: Any, empty: bytes | str | None) -> None:
        """Service Bus takes an empty body (``ServiceBusMessage(b"")`` or ``None``): a signal
        whose meaning is in its subject and headers. It is received, abandoned, dead-lettered and
        requeued like any other."""
        queue.send("q", QueueMessage(empty, message_id="e1", subject="Ping", headers={"k": "v"}))
        [m] = queue.receive("q")
        assert (m.body, m.subject, m.headers) == (b"", "Ping", {"k": "v"})
        queue.abandon(m)
        [m] = queue.receive("q")
        assert m.body == b""
        queue.dead_letter(m, "Empty")
        [dl] = queue.list_dead_letters("q")
        assert (dl.message_id, dl.body) == ("e1", b"")
        if self.supports_dead_letter_admin:
            assert queue.requeue([dl.id]) == 1
            [again] = queue.receive("q")
            assert (again.message_id, again.body) == ("e1", b"")

    def test_duplicate_inside_window_is_accepted_and_dropped(
        self, queue: Any, clock: ManualClock
    ) -> None:
        assert queue.send("q", msg("d1")) == ["d1"]
        clock.advance(599)
        assert queue.send("q", msg("d1")) == []  # accepted, no error, no copy
        assert queue.send("q", [msg("d1"), msg("d2"), msg("d2")]) == ["d2"]
        assert [p.message_id for p in queue.peek("q")] == ["d1", "d2"]
        # the same id on another queue is a different message
        assert queue.send("other", msg("d1")) == ["d1"]

    def test_duplicate_after_window_is_a_new_message(self, queue: Any, clock: ManualClock) -> None:
        self.require("duplicate_cleanup")
        queue.send("q", msg("d1"))
        queue.complete(queue.receive("q")[0])
        clock.advance(601)
        assert queue.forget_expired_duplicates() == 1
        assert queue.send("q", msg("d1")) == ["d1"]
        clock.advance(601)
        assert queue.send("q", msg("d1")) == ["d1"]  # window passed without a cleanup: still new
        assert len(queue.peek("q")) == 2

    def test_duplicate_of_completed_message_inside_window_is_dropped(self, queue: Any) -> None:
        queue.send("q", msg("x"))
        queue.complete(queue.receive("q")[0])
        assert queue.send("q", msg("x")) == []
        assert queue.receive("q") == []

    def test_not_before_holds_delivery(self, queue: Any, clock: ManualClock) -> None:
        self.require("scheduled_delivery")
        queue.send("q", [msg("later", not_before=clock.now() + timedelta(seconds=60)), msg("now")])
        [now] = queue.receive("q", 10)
        assert now.message_id == "now"
        queue.complete(now)
        assert queue.stats()["q"].scheduled == 1
        clock.advance(59)
        assert queue.receive("q") == []
        clock.advance(1)
        assert ids(queue.receive("q")) == ["later"]

    def test_session_is_fifo_with_one_holder(self, queue: Any) -> None:
        self.require("sessions")
        queue.send("q", [msg("a1", "A"), msg("a2", "A"), msg("b1", "B"), msg("a3", "A"), msg("n1")])
        first = queue.receive("q", 10)
        # one message per session, other sessions and session-less messages in parallel
        assert ids(first) == ["a1", "b1", "n1"]
        assert queue.receive("q", 10) == []  # A and B are held
        by_id = {m.message_id: m for m in first}
        queue.complete(by_id["a1"])
        [a2] = queue.receive("q", 10)
        assert a2.message_id == "a2"
        queue.abandon(a2)
        assert ids(queue.receive("q", 10)) == ["a2"]  # an abandoned head keeps its place

    def test_receive_one_session(self, queue: Any) -> None:
        self.require("sessions")
        queue.send("q", [msg("a1", "A"), msg("b1", "B"), msg("b2", "B")])
        assert ids(queue.receive("q", 5, session_id="B")) == ["b1"]
        assert queue.receive("q", 5, session_id="B") == []
        assert ids(queue.receive("q", 5, session_id="A")) == ["a1"]

    def test_abandon_with_delay_holds_the_whole_session(
        self, queue: Any, clock: ManualClock
    ) -> None:
        self.require("sessions", "scheduled_delivery")
        queue.send("q", [msg("a1", "A"), msg("a2", "A")])
        queue.abandon(queue.receive("q")[0], delay=10)
        assert queue.receive("q", 10) == []  # a2 must not overtake a1
        clock.advance(10)
        assert ids(queue.receive("q", 10)) == ["a1"]

    def test_scheduled_message_joins_its_session_at_its_time(
        self, queue: Any, clock: ManualClock
    ) -> None:
        """As on Service Bus: a scheduled message is not in its session until its time, so it
        holds back none of the session's due messages; once due it waits for the session's
        holder like any other (one holder per session)."""
        self.require("sessions", "scheduled_delivery")
        queue.send(
            "q", [msg("a1", "A", not_before=clock.now() + timedelta(seconds=5)), msg("a2", "A")]
        )
        [a2] = queue.receive("q")
        assert a2.message_id == "a2"
        clock.advance(5)  # a1 is due now, but a2 still holds the session
        assert queue.receive("q", 10) == []
        assert queue.receive("q", 10, session_id="A") == []
        queue.complete(a2)
        [a1] = queue.receive("q")
        assert (a1.message_id, a1.session_id) == ("a1", "A")

    def test_scheduled_message_alone_in_its_session_waits_for_its_time(
        self, queue: Any, clock: ManualClock
    ) -> None:
        self.require("sessions", "scheduled_delivery")
        queue.send("q", msg("a1", "A", not_before=clock.now() + timedelta(seconds=5)))
        assert queue.receive("q") == []
        clock.advance(5)
        assert ids(queue.receive("q")) == ["a1"]

    # --- defer --------------------------------------------------------------------------------

    def test_defer_sets_aside_until_received_by_number(
        self, queue: Any, clock: ManualClock
    ) -> None:
        self.require("defer")
        queue.send("q", [msg("a"), msg("b")])
        [a] = queue.receive("q")
        queue.defer(a)
        [b] = queue.receive("q", 10)  # a is out of the line
        assert b.message_id == "b"
        queue.complete(b)
        clock.advance(3600)
        assert queue.receive("q", 10) == []
        if self.supports_deferred_count:
            stats = queue.stats("q")["q"]
            assert (stats.active, stats.deferred, stats.total) == (0, 1, 1)
        [again] = queue.receive_deferred("q", [a.sequence_number])
        assert (again.message_id, again.sequence_number) == ("a", a.sequence_number)
        assert again.delivery_count == 2  # a deferral keeps the count; this is a delivery
        assert again.locked_until == clock.now() + timedelta(seconds=30)
        assert again.body == b"body-a"
        queue.complete(again)
        assert queue.stats("q") == {}

    def test_deferred_head_lets_its_session_go_on(self, queue: Any) -> None:
        self.require("defer", "sessions")
        queue.send("q", [msg("a1", "A"), msg("a2", "A"), msg("a3", "A")])
        [a1] = queue.receive("q")
        queue.defer(a1)
        [a2] = queue.receive("q", 10)
        assert a2.message_id == "a2"
        queue.complete(a2)
        [a3] = queue.receive("q", 10, session_id="A")
        assert a3.message_id == "a3"
        queue.complete(a3)
        [back] = queue.receive_deferred("q", a1.sequence_number, session_id="A")
        assert (back.message_id, back.session_id) == ("a1", "A")
        queue.complete(back)
        assert queue.receive("q", 10) == []

    def test_deferred_message_abandoned_stays_deferred_then_dead_letters(self, queue: Any) -> None:
        self.require("defer")
        queue.send("q", msg("a"))
        [a] = queue.receive("q")  # delivery 1
        queue.defer(a)
        [d] = queue.receive_deferred("q", [a.sequence_number])  # delivery 2
        queue.abandon(d)
        assert queue.receive("q", 10) == []  # abandoned, still deferred
        [d] = queue.receive_deferred("q", [a.sequence_number])  # delivery 3 = the limit
        assert d.delivery_count == 3
        queue.abandon(d)
        [dl] = queue.list_dead_letters("q")
        assert (dl.message_id, dl.reason) == ("a", "MaxDeliveryCountExceeded")

    def test_deferring_at_max_delivery_count_dead_letters(self, queue: Any) -> None:
        """As on Service Bus (Azure/azure-service-bus#375): a defer counts like an abandon."""
        self.require("defer")
        queue.send("q", msg("a"))
        [a] = queue.receive("q")  # delivery 1
        queue.defer(a)
        [d] = queue.receive_deferred("q", [a.sequence_number])  # delivery 2
        queue.defer(d)
        [d] = queue.receive_deferred("q", [a.sequence_number])  # delivery 3 = the limit
        queue.defer(d)
        [dl] = queue.list_dead_letters("q")
        assert (dl.message_id, dl.reason) == ("a", "MaxDeliveryCountExceeded")
        with pytest.raises(MessageNotFoundError):
            queue.receive_deferred("q", [a.sequence_number])

    def test_deferred_message_settles_every_way(self, queue: Any) -> None:
        self.require("defer")
        queue.send("q", [msg("a"), msg("b")])
        a, b = queue.receive("q", 2)
        queue.defer(a)
        queue.defer(b)
        [a2] = queue.receive_deferred("q", [a.sequence_number])
        queue.defer(a2)  # deferred again
        [a3] = queue.receive_deferred("q", [a.sequence_number])
        queue.dead_letter(a3, "Later")
        [b2] = queue.receive_deferred("q", [b.sequence_number])
        queue.complete(b2)
        assert [d.message_id for d in queue.list_dead_letters("q")] == ["a"]
        assert queue.receive("q", 10) == []

    def test_receive_deferred_of_what_is_not_deferred_is_not_found(self, queue: Any) -> None:
        self.require("defer")
        queue.send("q", [msg("a"), msg("b")])
        a, b = queue.receive("q", 2)
        queue.defer(a)
        with pytest.raises(MessageNotFoundError):
            queue.receive_deferred("q", [b.sequence_number])  # locked, not deferred
        [got] = queue.receive_deferred("q", [a.sequence_number])
        with pytest.raises(MessageNotFoundError):
            queue.receive_deferred("q", [a.sequence_number])  # held by this receiver already
        queue.complete(got)
        with pytest.raises(MessageNotFoundError):
            queue.receive_deferred("q", [a.sequence_number])  # settled
        queue.complete(b)

    def test_defer_needs_the_lock(self, queue: Any, clock: ManualClock) -> None:
        self.require("defer")
        queue.send("q", msg("a"))
        [a] = queue.receive("q")
        clock.advance(30)
        with pytest.raises(LockLostError):
            queue.defer(a)
        [again] = queue.receive("q")  # not deferred: it is redelivered as usual
        assert again.delivery_count == 2

    def test_deferred_lock_expiry_keeps_it_deferred(self, queue: Any, clock: ManualClock) -> None:
        self.require("defer")
        queue.send("q", msg("a"))
        [a] = queue.receive("q")
        queue.defer(a)
        [d] = queue.receive_deferred("q", [a.sequence_number])
        clock.advance(30)  # the lock of the deferred delivery runs out
        assert queue.receive("q", 10) == []
        with pytest.raises(LockLostError):
            queue.complete(d)
        [d] = queue.receive_deferred("q", [a.sequence_number])
        assert d.delivery_count == 3
        queue.complete(d)

    def test_complete_removes(self, queue: Any, clock: ManualClock) -> None:
        queue.send("q", msg("a"))
        queue.complete(queue.receive("q")[0])
        clock.advance(3600)
        assert queue.receive("q") == []
        assert queue.stats() == {}

    def test_complete_by_bare_lock_token(self, queue: Any) -> None:
        queue.send("q", msg("a"))
        [m] = queue.receive("q")
        assert m.lock_token is not None
        queue.complete(m.lock_token)
        assert queue.peek("q") == []

    def test_abandon_redelivers_with_higher_count(self, queue: Any, clock: ManualClock) -> None:
        self.require("scheduled_delivery")
        queue.send("q", msg("a"))
        queue.abandon(queue.receive("q")[0], delay=30)
        assert queue.stats()["q"].scheduled == 1
        clock.advance(30)
        [again] = queue.receive("q")
        assert again.delivery_count == 2

    def test_dead_letter_moves_with_reason(self, queue: Any, clock: ManualClock) -> None:
        queue.send("q", msg("poison", "S", subject="T"))
        [m] = queue.receive("q")
        queue.dead_letter(m, "BadFormat", "field x missing")
        assert queue.peek("q") == []
        [dl] = queue.list_dead_letters("q")
        assert (dl.message_id, dl.reason, dl.description, dl.delivery_count) == (
            "poison",
            "BadFormat",
            "field x missing",
            1,
        )
        assert (dl.session_id, dl.subject, dl.body, dl.dead_lettered_at) == (
            "S",
            "T",
            b"body-poison",
            clock.now(),
        )
        assert queue.get_dead_letter(dl.id) == dl
        assert queue.stats()["q"].dead_lettered == 1

    def test_renew_lock_extends(self, queue: Any, clock: ManualClock) -> None:
        queue.send("q", msg("a"))
        [m] = queue.receive("q")
        clock.advance(20)
        assert queue.renew_lock(m) == clock.now() + timedelta(seconds=30)
        clock.advance(20)  # 40s after receive, but renewed at 20s
        assert queue.receive("q") == []
        queue.complete(m)

    @pytest.mark.parametrize("action", ["complete", "abandon", "dead_letter", "renew_lock"])
    def test_expired_lock_is_lost_and_changes_nothing(
        self, queue: Any, clock: ManualClock, action: str
    ) -> None:
        queue.send("q", msg("a"))
        [m] = queue.receive("q")
        clock.advance(30)
        before = queue.peek("q")
        with pytest.raises(LockLostError, match="message a"):
            _settle(queue, m, action)
        assert queue.peek("q") == before
        assert queue.list_dead_letters() == []

    @pytest.mark.parametrize("action", ["complete", "abandon", "dead_letter", "renew_lock"])
    def test_foreign_lock_is_lost_and_changes_nothing(
        self, queue: Any, clock: ManualClock, action: str
    ) -> None:
        queue.send("q", msg("a"))
        [old] = queue.receive("q")
        clock.advance(31)
        [new] = queue.receive("q")  # someone else holds it now
        before = (queue.peek("q"), queue.stats(), queue.list_dead_letters())
        with pytest.raises(LockLostError):
            _settle(queue, old, action)
        assert (queue.peek("q"), queue.stats(), queue.list_dead_letters()) == before
        queue.complete(new)  # the real holder still can

    def test_settling_twice_is_lost(self, queue: Any) -> None:
        queue.send("q", msg("a"))
        [m] = queue.receive("q")
        queue.complete(m)
        with pytest.raises(LockLostError):
            queue.complete(m)

    def test_lock_expiry_redelivers_then_dead_letters(self, queue: Any, clock: ManualClock) -> None:
        self.require("sessions")
        queue.send("q", [msg("a", "S"), msg("b", "S")])
        counts = []
        for _ in range(3):  # max_delivery_count=3
            [m] = queue.receive("q")
            counts.append((m.message_id, m.delivery_count))
            assert queue.receive("q") == []  # still locked
            clock.advance(30)
        assert counts == [("a", 1), ("a", 2), ("a", 3)]
        # the fourth delivery attempt dead-letters "a" and uncovers "b" in the same receive
        assert ids(queue.receive("q")) == ["b"]
        [dl] = queue.list_dead_letters()
        assert (dl.message_id, dl.reason, dl.delivery_count) == ("a", "MaxDeliveryCountExceeded", 3)

    def test_abandon_at_max_delivery_dead_letters(self, queue: Any) -> None:
        queue.send("q", msg("a"))
        for _ in range(3):
            [m] = queue.receive("q")
            queue.abandon(m)
        assert queue.peek("q") == []
        assert queue.list_dead_letters()[0].reason == "MaxDeliveryCountExceeded"

    def test_receive_and_delete(self, queue: Any) -> None:
        self.require("receive_and_delete", "sessions")
        queue.send("q", [msg("a", "S"), msg("b", "S"), msg("c")])
        got = queue.receive_and_delete("q", 10)
        assert ids(got) == ["a", "c"]
        assert all(m.lock_token is None for m in got)
        assert ids(queue.receive_and_delete("q", 10)) == ["b"]
        with pytest.raises(ValidationError, match="no lock"):
            queue.complete(got[0])

    def test_requeue_keeps_message_id_and_resets_count(self, queue: Any) -> None:
        self.require("dead_letter_admin")
        _dead(queue, ("a", "R1"), ("b", "R2"), ("c", "R1"))
        dls = queue.list_dead_letters()
        assert queue.requeue([dls[1].id]) == 1
        [m] = queue.receive("q")
        assert (m.message_id, m.delivery_count) == ("b", 1)
        queue.complete(m)
        assert queue.requeue(where={"reason": "R1"}) == 2
        assert ids(queue.receive("q", 10)) == ["a", "c"]
        assert queue.list_dead_letters() == []

    def test_requeue_all_and_purge(self, queue: Any) -> None:
        self.require("dead_letter_admin")
        _dead(queue, ("a", "R"), ("b", "R"))
        seen: list[int] = []
        assert queue.count_dead_letters(all=True) == 2
        assert queue.requeue(all=True, on_progress=seen.append) == 2
        assert sum(seen) == 2
        for m in queue.receive("q", 10):
            queue.dead_letter(m, "again")
        assert queue.purge(where={"queue": "q", "reason": "again"}) == 2
        assert queue.stats() == {}

    def test_dead_letter_selection_errors(self, queue: Any) -> None:
        self.require("dead_letter_admin")
        with pytest.raises(MessageNotFoundError):
            queue.get_dead_letter(999)
        with pytest.raises(ValidationError, match="exactly one"):
            queue.requeue()
        with pytest.raises(ValidationError, match="exactly one"):
            queue.purge([1], all=True)
        with pytest.raises(ValidationError, match="filter dead letters by 'body'"):
            queue.purge(where={"body": "x"})

    def test_peek_does_not_lock_and_shows_state(self, queue: Any, clock: ManualClock) -> None:
        self.require("scheduled_delivery")
        queue.send(
            "q", [msg("a"), msg("b", not_before=clock.now() + timedelta(seconds=9)), msg("c")]
        )
        queue.receive("q")
        peeked = queue.peek("q", limit=10)
        assert [(p.message_id, p.state) for p in peeked] == [
            ("a", "locked"),
            ("b", "scheduled"),
            ("c", "active"),
        ]
        assert len(queue.peek("q", limit=2)) == 2
        assert ids(queue.receive("q")) == ["c"]  # peek took no lock

    def test_stats_per_queue(self, queue: Any, clock: ManualClock) -> None:
        self.require("scheduled_delivery")
        queue.send(
            "one", [msg("a"), msg("b"), msg("c", not_before=clock.now() + timedelta(hours=1))]
        )
        queue.send("two", [msg("x")])
        queue.receive("one")
        queue.dead_letter(queue.receive("two")[0], "R")
        stats = queue.stats()
        assert (stats["one"].active, stats["one"].scheduled, stats["one"].locked) == (1, 1, 1)
        assert (stats["two"].total, stats["two"].dead_lettered) == (0, 1)
        clock.advance(30)  # the lock expired: counted as active again
        assert queue.stats()["one"].active == 2

    def test_closed_queue_refuses(self, queue: Any) -> None:
        queue.close()
        with pytest.raises(ClosedError):
            queue.send("q", msg("a"))
        with pytest.raises(ClosedError):
            queue.receive("q")

    def test_stats_of_one_queue(self, queue: Any) -> None:
        queue.send("a", msg("1"))
        queue.send("b", [msg("2"), msg("3")])
        assert list(queue.stats("b")) == ["b"]
        assert queue.stats("b")["b"].active == 2
        assert queue.stats("empty") == {}

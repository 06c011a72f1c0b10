"""The consumer-inbox contract: a message id is claimed by one delivery at a time, a live claim
keeps the others out until it is recorded or its lease ends, a recorded id stays handled, and a
claim left by a crashed handler is taken over once its lease has ended.

Why it ships: the consumer's "no concurrent duplicates" rests on it. Two deliveries of one
message id (a resend outside the queue's duplicate detection, copies in two regions, several
consumer threads or processes) must never run the handler at once, and a repeat must not run it
again once the first run was recorded. An inbox in another store subclasses ``InboxContract``
and implements ``make_inbox``; ``close_inbox`` closes it after each test.
``dispatcher.queue.inbox.SqlInbox`` and ``dispatcher.queue.inbox_cosmos.CosmosInbox`` run it.

The tests that drive a ``Consumer`` over the inbox (two deliveries released together by a
barrier, a crashed handler's claim taken over by the clock) are ``InboxConsumerContract``: the
consumer's own guarantee, checked against each inbox. They use a SQLite queue in the test's
temporary folder unless ``make_queue`` is overridden (the SQL inbox puts it in its own database,
so the record and the completion share a transaction there).

Why one module: the inbox's promises and the consumer's guarantee over them are one contract a
backend runs (``InboxConsumerContract`` includes ``InboxContract``); split, a third party could
run the half that proves the least.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.inbox import ClaimOutcome, Inbox
from dispatcher.queue.messages import ReceivedMessage
from outbox.core.clock import ManualClock

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
#: Longest wait for another thread in a test (a failing test, not a timing assumption).
WAIT = 20.0


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


class InboxContract:
    """Subclass as ``Test<YourInbox>``; override ``make_inbox``."""

    #: one instance may be used by several threads at once (a consumer's handler pool)
    thread_safe = True

    def make_inbox(self, consumer: str) -> Inbox:
        """An inbox for ``consumer`` over a fresh, empty store (after the subclass's fixtures).
        Inboxes made in one test for different consumers share that store."""
        raise NotImplementedError

    def close_inbox(self, inbox: Inbox) -> None:
        """Release what ``make_inbox`` opened; by default ``inbox.close()`` if any."""
        close = getattr(inbox, "close", None)
        if callable(close):
            close()

    @pytest.fixture
    def inbox_for(self) -> Iterator[Callable[[str], Inbox]]:
        made: list[Inbox] = []

        def make(consumer: str) -> Inbox:
            made.append(self.make_inbox(consumer))
            return made[-1]

        yield make
        for inbox in made:
            self.close_inbox(inbox)

    def _race(self, count: int, work: Callable[[int], Any]) -> list[Any]:
        """``work(i)`` on ``count`` threads released together; the results in thread order."""
        if not self.thread_safe:
            pytest.skip("the inbox does not claim thread safety (thread_safe = False)")
        start = threading.Barrier(count)
        results: list[Any] = [None] * count

        def run(i: int) -> None:
            start.wait(WAIT)
            results[i] = work(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 3)
        assert not any(t.is_alive() for t in threads), "a racing call never returned"
        return results

    # --- records ---------------------------------------------------------------------------

    def test_an_id_is_recorded_once(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("billing")
        assert inbox.consumer == "billing"
        assert inbox.handled("m1") is False
        assert inbox.record("m1", at=NOW) is True
        assert inbox.handled("m1") is True
        assert inbox.record("m1", at=NOW) is False  # a repeat learns it was second
        assert inbox.handled("m2") is False

    def test_consumers_keep_separate_records(self, inbox_for: Callable[[str], Inbox]) -> None:
        billing, shipping = inbox_for("billing"), inbox_for("shipping")
        assert billing.record("m1", at=NOW) is True
        assert shipping.handled("m1") is False
        assert shipping.record("m1", at=NOW) is True
        assert inbox_for("billing").handled("m1") is True  # another instance, same records
        assert billing.claim("m2", "a", lease=LEASE, at=NOW).won
        assert shipping.claim("m2", "b", lease=LEASE, at=NOW).won  # claims are per consumer too

    def test_any_message_id(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("c")
        ids = ["a/b?c#d%e\\f", "ünïcödé ✓", "x" * 128, "doc-1:42:7"]
        for mid in ids:
            assert inbox.record(mid, at=NOW) is True
        assert all(inbox.handled(mid) for mid in ids)
        assert inbox.handled("a/b?c#d%e") is False

    def test_racing_recorders_exactly_one_wins(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("c")
        wins = self._race(8, lambda _i: inbox.record("same", at=NOW))
        assert sorted(wins) == [False] * 7 + [True]

    # --- claims ----------------------------------------------------------------------------

    def test_a_live_claim_keeps_others_out_until_it_is_recorded(
        self, inbox_for: Callable[[str], Inbox]
    ) -> None:
        inbox = inbox_for("c")
        won = inbox.claim("m", "a", lease=LEASE, at=at(0))
        assert (won.outcome, won.owner, won.lease_until) == (ClaimOutcome.WON, "a", at(30))
        assert inbox.handled("m") is False  # claimed is not handled
        held = inbox_for("c").claim("m", "b", lease=LEASE, at=at(10))  # another process
        assert (held.outcome, held.owner, held.lease_until) == (ClaimOutcome.HELD, "a", at(30))
        assert inbox.renew("m", "a", lease=LEASE, at=at(20)) is True
        assert inbox.claim("m", "b", lease=LEASE, at=at(35)).lease_until == at(50)  # renewed
        assert inbox.record("m", at=at(40)) is True
        assert inbox.handled("m") is True
        assert inbox.claim("m", "b", lease=LEASE, at=at(41)).outcome is ClaimOutcome.HANDLED
        assert inbox.claim("m", "a", lease=LEASE, at=at(99)).handled  # for ever, even its owner
        assert inbox.renew("m", "a", lease=LEASE, at=at(42)) is False
        assert inbox.record("m", at=at(43)) is False

    def test_a_claim_whose_lease_ended_is_taken_over(
        self, inbox_for: Callable[[str], Inbox]
    ) -> None:
        """The handler holding it crashed or hung: its lease ends, another delivery takes over,
        and the old owner can neither renew nor release it."""
        inbox = inbox_for("c")
        assert inbox.claim("m", "crashed", lease=LEASE, at=at(0)).won
        assert inbox.claim("m", "b", lease=LEASE, at=at(29)).held
        taken = inbox.claim("m", "b", lease=LEASE, at=at(30))  # the lease ends at 30
        assert (taken.outcome, taken.owner, taken.lease_until) == (ClaimOutcome.WON, "b", at(60))
        assert inbox.renew("m", "crashed", lease=LEASE, at=at(31)) is False
        inbox.release("m", "crashed")  # not its claim any more: nothing happens
        assert inbox.claim("m", "c", lease=LEASE, at=at(32)).owner == "b"
        assert inbox.record("m", at=at(33)) is True

    def test_a_released_claim_is_free_at_once(self, inbox_for: Callable[[str], Inbox]) -> None:
        """A handler failed: the claim is released, and a retry by anyone claims it before the
        lease would have ended."""
        inbox = inbox_for("c")
        assert inbox.claim("m", "a", lease=LEASE, at=at(0)).won
        inbox.release("m", "b")  # not b's: nothing happens
        assert inbox.claim("m", "b", lease=LEASE, at=at(1)).held
        inbox.release("m", "a")
        assert inbox.handled("m") is False
        assert inbox.renew("m", "a", lease=LEASE, at=at(2)) is False
        assert inbox.claim("m", "b", lease=LEASE, at=at(2)).won
        inbox.release("m", "unknown-id-owner")
        inbox.release("never-claimed", "a")  # nothing to release: no error

    def test_the_owner_claims_again(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("c")
        assert inbox.claim("m", "a", lease=LEASE, at=at(0)).won
        again = inbox.claim("m", "a", lease=LEASE, at=at(10))
        assert (again.outcome, again.lease_until) == (ClaimOutcome.WON, at(40))

    def test_racing_claimers_exactly_one_wins(self, inbox_for: Callable[[str], Inbox]) -> None:
        """Eight deliveries of one id, released together by a barrier, each with its own inbox
        instance (as separate processes would have): one wins, the others see it held by the
        winner."""
        inboxes = [inbox_for("c") for _ in range(8)]
        claims = self._race(8, lambda i: inboxes[i].claim("same", f"o{i}", lease=LEASE, at=at(0)))
        winners = [c.owner for c in claims if c.won]
        assert len(winners) == 1
        assert all(c.held and c.owner == winners[0] for c in claims if not c.won)

    def test_racing_takeovers_exactly_one_wins(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("c")
        assert inbox.claim("same", "crashed", lease=LEASE, at=at(0)).won
        claims = self._race(8, lambda i: inbox.claim("same", f"o{i}", lease=LEASE, at=at(31)))
        winners = [c.owner for c in claims if c.won]
        assert len(winners) == 1
        assert all(c.held and c.owner == winners[0] for c in claims if not c.won)

    def test_a_claim_racing_a_record_never_wins_a_handled_id(
        self, inbox_for: Callable[[str], Inbox]
    ) -> None:
        inbox = inbox_for("c")
        assert inbox.claim("m", "a", lease=LEASE, at=at(0)).won
        results = self._race(
            2,
            lambda i: (
                inbox.record("m", at=at(1))
                if i == 0
                else inbox.claim("m", "b", lease=LEASE, at=at(31))
            ),
        )
        recorded, claim = results
        assert recorded is True
        assert claim.outcome in (ClaimOutcome.WON, ClaimOutcome.HANDLED)
        assert inbox.handled("m") is True  # a record is never undone by a claim
        assert inbox.claim("m", "c", lease=LEASE, at=at(99)).handled


class InboxConsumerContract(InboxContract):
    """``InboxContract`` plus a ``Consumer`` over the inbox: concurrent deliveries of one message
    id run the handler once, and a crashed handler's claim is taken over."""

    QUEUE = "q"

    def make_queue(self, tmp_path: Path, clock: ManualClock) -> SqlQueue:
        """A migrated queue on ``clock`` (lock 30 s, duplicate detection 600 s, 5 deliveries),
        closed by the contract. Default: a SQLite file in ``tmp_path``."""
        from migrations.sql import upgrade

        url = f"sqlite:///{tmp_path / 'inbox-contract-queue.db'}"
        upgrade(url)
        return SqlQueue(
            url, clock=clock, lock_duration=30, max_delivery_count=5, duplicate_detection_window=600
        )

    @pytest.fixture
    def manual_clock(self) -> ManualClock:
        return ManualClock(NOW)

    @pytest.fixture
    def consumer_queue(self, tmp_path: Path, manual_clock: ManualClock) -> Iterator[SqlQueue]:
        queue = self.make_queue(tmp_path, manual_clock)
        yield queue
        queue.close()

    def _twice(self, queue: SqlQueue, clock: ManualClock, mid: str = "x") -> None:
        """Two queue messages with one id: the second is sent after duplicate detection's
        window, as a resend (or another region's copy) would be."""
        queue.send(self.QUEUE, QueueMessage(b"1", message_id=mid))
        clock.advance(601)
        queue.send(self.QUEUE, QueueMessage(b"2", message_id=mid))
        assert queue.stats(self.QUEUE)[self.QUEUE].total == 2

    def test_concurrent_deliveries_run_the_handler_once(
        self,
        inbox_for: Callable[[str], Inbox],
        consumer_queue: SqlQueue,
        manual_clock: ManualClock,
    ) -> None:
        """Two consumers of one name (two processes), each with one delivery of "x", released
        together after both received: the first handler does not return until the other
        delivery has decided (run the handler too, or settle). Exactly one handler runs; the
        other delivery is not completed before the id is recorded: it waits (abandoned until
        the claim's lease ends) and is then completed without running the handler."""
        if not self.thread_safe:
            pytest.skip("the inbox does not claim thread safety (thread_safe = False)")
        queue, clock = consumer_queue, manual_clock
        self._twice(queue, clock)
        calls: list[bytes] = []
        guard = threading.Lock()
        decided = threading.Event()  # the second delivery ran its handler, or was settled
        both_received = threading.Barrier(2)
        real_receive = queue.receive

        def receive(*a: Any, **kw: Any) -> list[ReceivedMessage]:
            got = real_receive(*a, **kw)
            both_received.wait(WAIT)
            return got

        def handler(m: ReceivedMessage) -> None:
            with guard:
                calls.append(m.body)
                if len(calls) == 2:
                    decided.set()
            if not decided.wait(WAIT):
                raise AssertionError("the other delivery never decided")

        completed_while: list[bool] = []  # was "x" recorded at each queue completion?
        real_complete = queue.complete
        checker = inbox_for("billing")

        def complete(m: Any) -> None:
            completed_while.append(checker.handled(m.message_id))
            real_complete(m)

        queue.receive = receive
        queue.complete = complete  # type: ignore[assignment]
        consumers = [
            Consumer(queue, self.QUEUE, handler, inbox=inbox_for("billing"), claim_owner=f"p{i}")
            for i in range(2)
        ]

        def run(consumer: Consumer) -> None:
            try:
                assert consumer.run_once(max_messages=1) == 1
            finally:
                decided.set()

        threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 3)
        queue.receive = real_receive
        assert len(calls) == 1, f"the handler ran {len(calls)} times for one message id"
        assert inbox_for("billing").handled("x")
        [waiting] = queue.peek(self.QUEUE)  # the duplicate waits; it was not dropped
        assert waiting.state == "scheduled"
        clock.advance(30)  # at most one lease later it is delivered again, and dropped
        assert consumers[1].run_once() == 1
        assert len(calls) == 1
        assert queue.stats(self.QUEUE) == {}
        assert completed_while
        assert all(completed_while)
        for c in consumers:
            c.stop()

    def test_two_deliveries_to_one_consumers_threads_run_the_handler_once(
        self,
        inbox_for: Callable[[str], Inbox],
        consumer_queue: SqlQueue,
        manual_clock: ManualClock,
    ) -> None:
        """Both deliveries in one batch of one consumer with two threads: each delivery is its
        own claimer, so the second waits (the consumer's name alone would let both run)."""
        if not self.thread_safe:
            pytest.skip("the inbox does not claim thread safety (thread_safe = False)")
        queue, clock = consumer_queue, manual_clock
        self._twice(queue, clock)
        calls: list[bytes] = []
        guard = threading.Lock()
        decided = threading.Event()
        real_abandon = queue.abandon

        def abandon(m: Any, delay: float = 0) -> None:
            real_abandon(m, delay=delay)
            decided.set()

        def handler(m: ReceivedMessage) -> None:
            with guard:
                calls.append(m.body)
                if len(calls) == 2:
                    decided.set()
            if not decided.wait(WAIT):
                raise AssertionError("the other delivery never decided")

        queue.abandon = abandon  # type: ignore[assignment]
        consumer = Consumer(queue, self.QUEUE, handler, inbox=inbox_for("billing"), concurrency=2)
        assert consumer.run_once() == 2
        assert len(calls) == 1, f"the handler ran {len(calls)} times for one message id"
        clock.advance(30)
        assert consumer.run_once() == 1
        assert len(calls) == 1
        assert queue.stats(self.QUEUE) == {}

    def test_a_claim_left_by_a_crashed_handler_is_taken_over(
        self,
        inbox_for: Callable[[str], Inbox],
        consumer_queue: SqlQueue,
        manual_clock: ManualClock,
    ) -> None:
        """A handler dies mid-run (its claim, with a 60 s lease, and the message's 30 s lock
        are left behind). The redelivery after the lock waits for the lease; after it, another
        consumer takes the claim over and the message is handled, once more."""
        queue, clock = consumer_queue, manual_clock
        queue.send(self.QUEUE, QueueMessage(b"1", message_id="x"))

        class Crash(BaseException):
            pass

        def dies(_m: ReceivedMessage) -> None:
            raise Crash("the process died")

        crashed = Consumer(queue, self.QUEUE, dies, inbox=inbox_for("billing"), inbox_lease=60)
        with pytest.raises(Crash):
            crashed.run_once()
        calls: list[str] = []
        survivor = Consumer(
            queue,
            self.QUEUE,
            lambda m: calls.append(m.message_id),
            inbox=inbox_for("billing"),
            look_again=1,
        )
        assert survivor.run_once() == 0  # still locked by the dead receiver
        clock.advance(31)  # the lock ended; the claim's lease has 29 s left
        assert survivor.run_once() == 1
        assert calls == []  # held by a live claim: it waits, it is not dropped
        [waiting] = queue.peek(self.QUEUE)
        assert waiting.state == "scheduled"
        clock.advance(29)  # the lease has ended
        assert survivor.run_once() == 1
        assert calls == ["x"]
        assert inbox_for("billing").handled("x")
        assert queue.stats(self.QUEUE) == {}

    def test_a_failed_handler_releases_its_claim(
        self,
        inbox_for: Callable[[str], Inbox],
        consumer_queue: SqlQueue,
        manual_clock: ManualClock,
    ) -> None:
        """A handler that raised gives its claim up: the retry (here by another consumer, at
        once) runs the handler without waiting for the lease."""
        queue = consumer_queue
        queue.send(self.QUEUE, QueueMessage(b"1", message_id="x"))

        def fails(_m: ReceivedMessage) -> None:
            raise RuntimeError("downstream is down")

        calls: list[str] = []
        first = Consumer(queue, self.QUEUE, fails, inbox=inbox_for("billing"), backoff=lambda _n: 0)
        second = Consumer(
            queue, self.QUEUE, lambda m: calls.append(m.message_id), inbox=inbox_for("billing")
        )
        assert first.run_once() == 1
        assert not inbox_for("billing").handled("x")
        assert second.run_once() == 1
        assert calls == ["x"]
        assert queue.stats(self.QUEUE) == {}

    def test_a_long_handler_keeps_its_claim(
        self,
        inbox_for: Callable[[str], Inbox],
        consumer_queue: SqlQueue,
        manual_clock: ManualClock,
    ) -> None:
        """60 s of handler time on a 30 s lease: the claim is renewed, so another delivery of
        the id still finds it held at the end."""
        if not self.thread_safe:
            pytest.skip("the inbox does not claim thread safety (thread_safe = False)")
        queue, clock = consumer_queue, manual_clock
        queue.send(self.QUEUE, QueueMessage(b"1", message_id="x"))
        inbox = inbox_for("billing")
        renewed = threading.Event()
        real_renew = inbox.renew

        def renew(*a: Any, **kw: Any) -> bool:
            kept = real_renew(*a, **kw)
            renewed.set()
            return kept

        relocked = threading.Event()
        real_renew_lock = queue.renew_lock

        def renew_lock(m: Any) -> datetime:
            until = real_renew_lock(m)
            relocked.set()
            return until

        inbox.renew = renew  # type: ignore[method-assign]
        queue.renew_lock = renew_lock  # type: ignore[assignment]
        other = inbox_for("billing")
        seen: list[ClaimOutcome] = []

        def slow(_m: ReceivedMessage) -> None:
            for _ in range(3):
                renewed.clear()
                relocked.clear()
                clock.advance(20)
                assert renewed.wait(WAIT), "the claim was not renewed"
                assert relocked.wait(WAIT), "the lock was not renewed"
                seen.append(other.claim("x", "other", lease=LEASE, at=clock.now()).outcome)

        Consumer(queue, self.QUEUE, slow, inbox=inbox, renew_check_interval=0.01).run_once()
        assert seen == [ClaimOutcome.HELD] * 3
        assert inbox.handled("x")
        assert queue.stats(self.QUEUE) == {}

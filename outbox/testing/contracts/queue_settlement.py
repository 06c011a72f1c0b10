"""The queue contract, peek-lock settlement: complete, abandon and renew while the lock is valid,
``LockLostError`` and no change once it expired or belongs to another receiver, delivery counts up
to the dead-letter move, and receive-and-delete.

Part of ``queue.QueueContract`` (subclass that, not this): see ``queue`` for how to use it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dispatcher.queue.messages import ReceivedMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import LockLostError, ValidationError
from outbox.testing.contracts.queue_base import QueueContractBase, ids, msg


def _settle(queue: Any, m: ReceivedMessage, action: str) -> None:
    if action == "dead_letter":
        queue.dead_letter(m, "R")
    else:
        getattr(queue, action)(m)


class QueueSettlementContract(QueueContractBase):
    """Peek-lock settlement and delivery counts (``QueueReceiver``)."""

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

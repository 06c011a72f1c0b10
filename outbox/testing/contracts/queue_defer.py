"""The queue contract, defer: the fourth peek-lock settlement. A deferred message leaves its
session's line, keeps its delivery count, and comes back only by sequence number.

Part of ``queue.QueueContract`` (subclass that, not this): see ``queue`` for how to use it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.core.errors import LockLostError, MessageNotFoundError
from outbox.testing.contracts.queue_base import QueueContractBase, msg


class QueueDeferContract(QueueContractBase):
    """``defer`` and ``receive_deferred`` (``supports_defer``)."""

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

"""The queue contract, order: session FIFO with one holder, receiving one named session, scheduled
delivery, and how an abandon's delay and a scheduled message stand in their session's line.

Part of ``queue.QueueContract`` (subclass that, not this): see ``queue`` for how to use it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from outbox.core.clock import ManualClock
from outbox.testing.contracts.queue_base import QueueContractBase, ids, msg


class QueueSessionsContract(QueueContractBase):
    """Sessions and scheduled delivery."""

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

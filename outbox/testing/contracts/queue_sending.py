"""The queue contract, sending: every field carried, durable and atomic batches, empty bodies,
generated ids, duplicate detection inside and after its window, a closed queue refusing.

Part of ``queue.QueueContract`` (subclass that, not this): see ``queue`` for how to use it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dispatcher.queue.messages import QueueMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import ClosedError, ValidationError
from outbox.testing.contracts.queue_base import QueueContractBase, msg


class QueueSendingContract(QueueContractBase):
    """Sending and duplicate detection (``QueueSender``)."""

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

    def test_closed_queue_refuses(self, queue: Any) -> None:
        queue.close()
        with pytest.raises(ClosedError):
            queue.send("q", msg("a"))
        with pytest.raises(ClosedError):
            queue.receive("q")

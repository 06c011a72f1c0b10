"""The queue contract, administration: dead letters (the move, its reason, requeue, purge, the
selection rules), ``peek``'s states and ``stats`` per queue.

Part of ``queue.QueueContract`` (subclass that, not this): see ``queue`` for how to use it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.core.errors import MessageNotFoundError, ValidationError
from outbox.testing.contracts.queue_base import QueueContractBase, ids, msg


def _dead(queue: Any, *pairs: tuple[str, str]) -> None:
    for mid, reason in pairs:
        queue.send("q", msg(mid))
        [m] = queue.receive("q")
        queue.dead_letter(m, reason)


class QueueAdminContract(QueueContractBase):
    """Dead letters, peek and stats (``QueueAdministration``)."""

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

    def test_stats_of_one_queue(self, queue: Any) -> None:
        queue.send("a", msg("1"))
        queue.send("b", [msg("2"), msg("3")])
        assert list(queue.stats("b")) == ["b"]
        assert queue.stats("b")["b"].active == 2
        assert queue.stats("empty") == {}

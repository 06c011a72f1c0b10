"""The consumer-inbox contract: a handled message id is recorded once per consumer, and of
racing recorders exactly one wins.

Why it ships: a consumer's dedup rests on it (a repeat delivery or a resend of one message id must
not run the handler's effect twice once the first run was recorded). An inbox in another store
subclasses ``InboxContract`` and implements ``make_inbox``; ``close_inbox`` closes it after each
test. ``dispatcher.queue.inbox.SqlInbox`` and ``dispatcher.queue.inbox_cosmos.CosmosInbox`` run it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from dispatcher.queue.inbox import Inbox

NOW = datetime(2026, 1, 1, tzinfo=UTC)


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

    def test_any_message_id(self, inbox_for: Callable[[str], Inbox]) -> None:
        inbox = inbox_for("c")
        ids = ["a/b?c#d%e\\f", "ünïcödé ✓", "x" * 128, "doc-1:42:7"]
        for mid in ids:
            assert inbox.record(mid, at=NOW) is True
        assert all(inbox.handled(mid) for mid in ids)
        assert inbox.handled("a/b?c#d%e") is False

    def test_racing_recorders_exactly_one_wins(self, inbox_for: Callable[[str], Inbox]) -> None:
        if not self.thread_safe:
            pytest.skip("the inbox does not claim thread safety (thread_safe = False)")
        inbox = inbox_for("c")
        start = threading.Barrier(8)
        wins: list[bool] = []
        guard = threading.Lock()

        def recorder() -> None:
            start.wait()
            won = inbox.record("same", at=NOW)
            with guard:
                wins.append(won)

        threads = [threading.Thread(target=recorder) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(wins) == [False] * 7 + [True]

"""What pruning an inbox must do, for every inbox that can (``PrunableInbox``): the SQL inbox
(``tests/queue/test_inbox_pruning.py``, SQLite and PostgreSQL) and the Cosmos inbox
(``tests/cosmos/test_inbox_pruning.py``) subclass it. Times are given, never slept for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dispatcher.queue.inbox import ClaimOutcome, Inbox
from dispatcher.queue.inbox_pruning import PrunableInbox

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DAY = timedelta(days=1)
LEASE = timedelta(seconds=30)


class InboxPruningContract:
    def make_inbox(self, consumer: str) -> Inbox:
        raise NotImplementedError

    def _inbox(self, consumer: str = "billing") -> PrunableInbox:
        inbox = self.make_inbox(consumer)
        assert isinstance(inbox, PrunableInbox)
        return inbox

    def test_ids_handled_before_the_cutoff_go_and_later_ones_stay(self) -> None:
        inbox = self._inbox()
        assert isinstance(inbox, Inbox)
        inbox.record("old", at=T0)
        inbox.record("new", at=T0 + 2 * DAY)
        assert inbox.prune(T0 + DAY) == 1
        assert not inbox.handled("old")
        assert inbox.handled("new")
        assert inbox.prune(T0 + DAY) == 0
        # forgotten: a copy seen again now is handled again, as a new id
        assert inbox.claim("old", "a", lease=LEASE, at=T0 + 3 * DAY).won

    def test_a_live_claim_is_never_pruned_however_long_ago_it_was_taken(self) -> None:
        """Claimed ten days ago and renewed since: its handler is still running."""
        inbox = self._inbox()
        assert isinstance(inbox, Inbox)
        assert inbox.claim("slow", "a", lease=LEASE, at=T0).won
        now = T0 + 10 * DAY
        assert inbox.renew("slow", "a", lease=LEASE, at=now)
        assert inbox.prune(now - DAY) == 0
        assert inbox.prune(now) == 0  # even a cutoff of now: its lease ends later
        held = inbox.claim("slow", "b", lease=LEASE, at=now)
        assert (held.outcome, held.owner) == (ClaimOutcome.HELD, "a")

    def test_released_claims_and_claims_whose_lease_ended_before_the_cutoff_go(self) -> None:
        """Neither has a holder: pruning them changes no claim's outcome. A lease that ended
        after the cutoff stays (its holder may still renew it)."""
        inbox = self._inbox()
        assert isinstance(inbox, Inbox)
        for mid in ("released", "ended-long-ago", "ended-lately"):
            assert inbox.claim(mid, "a", lease=LEASE, at=T0).won
        inbox.release("released", "a")
        assert inbox.renew("ended-lately", "a", lease=LEASE, at=T0 + 2 * DAY)
        assert inbox.prune(T0 + DAY) == 2
        assert inbox.claim("ended-lately", "a", lease=LEASE, at=T0 + 2 * DAY).won  # still a's
        for mid in ("released", "ended-long-ago"):
            assert inbox.claim(mid, "b", lease=LEASE, at=T0 + 2 * DAY).won

    def test_a_consumer_prunes_its_own_records_and_maintain_every_consumers(self) -> None:
        billing, audit = self._inbox("billing"), self._inbox("audit")
        assert isinstance(billing, Inbox)
        assert isinstance(audit, Inbox)
        for inbox in (billing, audit):
            inbox.record("a", at=T0)
            inbox.record("b", at=T0)
        assert billing.prune(T0 + DAY, limit=1) == 1
        assert billing.prune(T0 + DAY) == 1
        assert audit.handled("a")
        assert audit.handled("b")
        assert billing.prune(T0 + DAY, every_consumer=True) == 2
        assert not audit.handled("a")
        assert not audit.handled("b")

"""The claim-log contract: of racing claimers one wins, a live lease keeps others out, an expired
one can be taken over, a finished entry never runs again, and registered keys keep their order.

Why it ships: the two-region consumer (``dispatcher.queue.claimed``) handles each message once and
in order only if its claim log does exactly this. A backend subclasses ``ClaimLogContract`` and
implements ``make_log`` (a log over a fresh, empty store; logs made in one test share it);
``dispatcher.claims.sql.SqlClaimLog`` (SQLite, PostgreSQL) and
``dispatcher.claims.cosmos.CosmosClaimLog`` run it. A log that offers ``bounded(timeout)`` (the
sender's write path, ``dispatcher.claims.ports.BoundedClaimLog``) must give a view of the same
entries that closes without closing the log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.claims.ports import BoundedClaimLog, ClaimLog, ClaimStatus
from outbox.core.errors import ClaimLostError

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class ClaimLogContract:
    """Subclass as ``Test<YourClaimLog>``; override ``make_log``."""

    def make_log(self) -> ClaimLog:
        raise NotImplementedError

    @pytest.fixture
    def new_log(self) -> Iterator[Callable[[], ClaimLog]]:
        made: list[ClaimLog] = []

        def make() -> ClaimLog:
            made.append(self.make_log())
            return made[-1]

        yield make
        for log in made:
            log.close()

    @pytest.fixture
    def log(self, new_log: Callable[[], ClaimLog]) -> ClaimLog:
        return new_log()

    def test_the_first_claim_creates_a_working_entry(self, log: ClaimLog) -> None:
        assert log.read("k") is None
        taken = log.claim("k", "east", lease=LEASE, at=at(0))
        assert taken.won
        e = taken.entry
        assert (e.key, e.status, e.owner, e.attempts) == ("k", ClaimStatus.WORKING, "east", 1)
        assert e.lease_until == at(30)
        assert log.read("k") == e

    def test_a_live_lease_keeps_others_out_and_an_expired_one_is_taken_over(
        self, log: ClaimLog
    ) -> None:
        log.claim("k", "east", lease=LEASE, at=at(0))
        lost = log.claim("k", "west", lease=LEASE, at=at(29))
        assert not lost.won
        assert lost.entry.owner == "east"
        won = log.claim("k", "west", lease=LEASE, at=at(31))
        assert won.won
        assert (won.entry.owner, won.entry.attempts, won.entry.lease_until) == ("west", 2, at(61))
        with pytest.raises(ClaimLostError):  # the old owner settles nothing
            log.complete("k", "east", at=at(32))
        with pytest.raises(ClaimLostError):
            log.renew("k", "east", lease=LEASE, at=at(32))
        assert log.read("k") == won.entry

    def test_the_owner_may_claim_again_and_renew(self, log: ClaimLog) -> None:
        log.claim("k", "east", lease=LEASE, at=at(0))
        again = log.claim("k", "east", lease=LEASE, at=at(10))
        assert again.won
        assert again.entry.attempts == 1
        assert again.entry.lease_until == at(40)
        renewed = log.renew("k", "east", lease=LEASE, at=at(20))
        assert renewed.lease_until == at(50)
        assert not log.claim("k", "west", lease=LEASE, at=at(45)).won

    def test_completed_and_failed_never_run_again(self, log: ClaimLog) -> None:
        log.claim("a", "east", lease=LEASE, at=at(0))
        done = log.complete("a", "east", at=at(1))
        assert done.status is ClaimStatus.COMPLETED
        assert done.status.finished
        log.claim("b", "east", lease=LEASE, at=at(0))
        assert log.fail("b", "east", at=at(1)).status is ClaimStatus.FAILED
        for key, status in (("a", ClaimStatus.COMPLETED), ("b", ClaimStatus.FAILED)):
            for who in ("east", "west"):
                taken = log.claim(key, who, lease=LEASE, at=at(3600))
                assert not taken.won
                assert taken.entry.status is status
            with pytest.raises(ClaimLostError):
                log.complete(key, "east", at=at(3600))

    def test_a_released_claim_is_pending_for_anyone(self, log: ClaimLog) -> None:
        log.claim("k", "east", lease=LEASE, at=at(0))
        released = log.release("k", "east", at=at(1))
        assert (released.status, released.owner) == (ClaimStatus.PENDING, None)
        with pytest.raises(ClaimLostError):
            log.release("k", "east", at=at(1))
        won = log.claim("k", "west", lease=LEASE, at=at(2))
        assert won.won
        assert won.entry.attempts == 2

    def test_registered_keys_keep_their_order_and_block_later_ones(self, log: ClaimLog) -> None:
        log.register("s", ["m1", "m2"], at=at(0))
        log.register("s", ["m2", "m3"], at=at(1))  # m2 is known: it keeps its position
        log.register("other", ["x1"], at=at(1))
        entries = [log.read(k) for k in ("m1", "m2", "m3")]
        assert all(e is not None and e.status is ClaimStatus.PENDING for e in entries)
        positions = [e.position or 0 for e in entries if e is not None]
        assert positions == sorted(positions)
        assert len(set(positions)) == 3
        assert all(e is not None and e.session == "s" for e in entries)
        p1, p2, p3 = positions
        assert log.blocker("s", p1) is None  # nothing before the first
        blocker = log.blocker("s", p3)
        assert blocker is not None
        assert blocker.key == "m1"
        log.claim("m1", "east", lease=LEASE, at=at(2))  # working is still unfinished
        blocker = log.blocker("s", p2)
        assert blocker is not None
        assert blocker.key == "m1"
        claimed = log.claim("m1", "east", lease=LEASE, at=at(2))
        assert claimed.entry.position == p1
        assert claimed.entry.session == "s"
        log.complete("m1", "east", at=at(3))
        assert log.blocker("s", p2) is None
        blocker = log.blocker("s", p3)
        assert blocker is not None
        assert blocker.key == "m2"
        log.claim("m2", "west", lease=LEASE, at=at(4))
        log.fail("m2", "west", at=at(5))  # failed is finished too: it blocks nothing
        assert log.blocker("s", p3) is None
        assert log.blocker("other", 10**9) is not None

    def test_any_key(self, log: ClaimLog) -> None:
        keys = ["a/b?c#d%e\\f", "ünïcödé ✓", "s" * 128 + "|" + "m" * 128, "doc-1:42:7"]
        log.register("sess/1 ✓", keys[:2], at=at(0))
        for k in keys:
            assert log.claim(k, "east", lease=LEASE, at=at(0)).won
        assert log.read("a/b?c#d%e") is None

    def test_racing_claimers_exactly_one_wins(self, new_log: Callable[[], ClaimLog]) -> None:
        for registered in (False, True):
            key = f"race-{registered}"
            if registered:
                new_log().register("s", [key], at=at(0))
            logs = [new_log() for _ in range(6)]
            wins = _race(logs, key)
            assert len(wins) == 1, wins
            entry = logs[0].read(key)
            assert entry is not None
            assert entry.owner == wins[0]

    def test_a_bounded_view_is_the_same_log(self, log: ClaimLog) -> None:
        if not isinstance(log, BoundedClaimLog):
            pytest.skip("this claim log offers no bounded view")
        view = log.bounded(30.0)  # generous: this is about sharing, not about the bound
        try:
            view.register("s", ["m1", "m2"], at=at(0))
            log.register("s", ["m3"], at=at(1))
            entries = [log.read(k) for k in ("m1", "m2", "m3")]
            positions = [e.position for e in entries if e is not None and e.position is not None]
            assert len(positions) == 3
            assert positions == sorted(positions)
            assert view.read("m3") == entries[2]
            assert view.claim("m1", "east", lease=LEASE, at=at(2)).won
            assert not log.claim("m1", "west", lease=LEASE, at=at(3)).won
            view.fail("m1", "east", at=at(4))
            blocker = view.blocker("s", positions[2])
            assert blocker is not None
            assert blocker.key == "m2"
        finally:
            view.close()
        assert log.read("m1") is not None  # closing the view left the log open
        assert log.claim("m2", "west", lease=LEASE, at=at(5)).won


def _race(logs: list[ClaimLog], key: str) -> list[str]:
    """Every log claims ``key`` at once; the owners that won."""
    start = threading.Barrier(len(logs))
    wins: list[str] = []
    guard = threading.Lock()

    def claimer(i: int, log: ClaimLog) -> None:
        start.wait()
        if log.claim(key, f"owner-{i}", lease=LEASE, at=at(0)).won:
            with guard:
                wins.append(f"owner-{i}")

    threads = [threading.Thread(target=claimer, args=(i, lg)) for i, lg in enumerate(logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wins

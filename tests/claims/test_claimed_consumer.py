"""The claim-aware consumer across two regions (two SQLite queues, one SQL claim log), in process
with an injected clock: once per message, in session order, takeover after a lease, the claim log
down, poison messages, renewal, and the open case of per-message claims."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatcher.claims.cosmos import CosmosClaimLog
from dispatcher.claims.ports import ClaimLog, ClaimStatus, message_key, session_key
from dispatcher.claims.sql import SqlClaimLog
from dispatcher.queue import Consumer, SqlQueue
from dispatcher.queue.claimed import FAILED_ELSEWHERE
from dispatcher.queue.messages import DeferMessage, ReceivedMessage
from dispatcher.transports.geo import GeoReplicatedTransport
from dispatcher.transports.sql import SqlQueueTransport
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    ClaimLogUnavailableError,
    ConfigurationError,
    UnprocessableMessageError,
)
from outbox.testing.contracts.transport import msg
from outbox.testing.faulty import FaultyTransport

Q = "contract-dest"
LEASE = 10.0


class Switchable:
    """A claim log that can be switched off (every call raises the retryable error)."""

    def __init__(self, inner: ClaimLog) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)

        def call(*a: Any, **k: Any) -> Any:
            if self.down and name != "close":
                raise ClaimLogUnavailableError("the claim log is down (test)")
            return target(*a, **k)

        return call


@dataclass
class Regions:
    clock: ManualClock
    queues: list[SqlQueue]
    claims: ClaimLog
    faulty: list[FaultyTransport]
    geo: GeoReplicatedTransport
    calls: list[tuple[str, str]] = field(default_factory=list)  # (region, message id)

    def consumer(
        self, region: int, handler: Callable[[ReceivedMessage], None] | None = None, **kw: Any
    ) -> Consumer:
        name = ("east", "west")[region]

        def record(m: ReceivedMessage) -> None:
            self.calls.append((name, m.message_id))

        kw.setdefault("claims", self.claims)
        kw.setdefault("claim_lease", LEASE)
        return Consumer(
            self.queues[region],
            Q,
            handler or record,
            claim_owner=name,
            look_again=1.0,
            renew_check_interval=0.01,
            backoff=lambda _n: 1.0,
            **kw,
        )

    def empty(self) -> bool:
        return all(q.stats().get(Q) is None for q in self.queues)


def drain(*consumers: Consumer) -> None:
    while sum(c.run_once() for c in consumers):
        pass


@pytest.fixture
def regions(tmp_path: Path, clock: ManualClock, migrated_sqlite: Any) -> Iterator[Regions]:
    claims = SqlClaimLog(migrated_sqlite(tmp_path / "claims.db"))
    with _regions(tmp_path, clock, migrated_sqlite, claims) as r:
        yield r


@contextmanager
def _regions(
    tmp_path: Path, clock: ManualClock, migrated_sqlite: Any, claims: Any
) -> Iterator[Regions]:
    queues = []
    for name in ("east", "west"):
        url = migrated_sqlite(tmp_path / f"{name}.db")
        queues.append(SqlQueue(url, clock=clock, lock_duration=30, max_delivery_count=100))
    faulty = [FaultyTransport(SqlQueueTransport(q)) for q in queues]
    geo = GeoReplicatedTransport(
        faulty[0], faulty[1], "15s", claims=claims, clock=clock, region_backoff=0
    )
    yield Regions(clock, queues, claims, faulty, geo)
    geo.close()
    claims.close()
    for q in queues:
        q.close()


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_normal_the_primary_handles_and_secondary_copies_complete_unhandled(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(i) for i in (1, 2, 3)] + [msg(1, "other")])
    east, west = regions.consumer(0), regions.consumer(1)
    drain(east, west)  # the secondary copies are not visible yet
    clock.advance(15)
    drain(east, west)
    assert regions.calls == [
        ("east", "m-s1-1"),
        ("east", "m-other-1"),
        ("east", "m-s1-2"),
        ("east", "m-s1-3"),
    ] or sorted(regions.calls) == sorted(
        [("east", f"m-s1-{i}") for i in (1, 2, 3)] + [("east", "m-other-1")]
    )
    assert [c for c in regions.calls if "s1" in c[1]] == [("east", f"m-s1-{i}") for i in (1, 2, 3)]
    assert west.claimed is not None
    assert (west.claimed.duplicates, west.claimed.handled) == (4, 0)
    assert regions.empty()


def test_the_secondary_handles_everything_when_the_primary_queue_is_down(
    regions: Regions, clock: ManualClock
) -> None:
    regions.faulty[0].outage()
    regions.geo.send([msg(i) for i in (1, 2, 3)])
    west = regions.consumer(1)
    drain(west)
    assert regions.calls == []  # not before secondary_delay
    clock.advance(15)
    drain(west)
    assert regions.calls == [("west", f"m-s1-{i}") for i in (1, 2, 3)]
    assert regions.empty()


def _blocked_handler(
    regions: Regions, started: threading.Event, release: threading.Event
) -> Callable[[ReceivedMessage], None]:
    def handler(m: ReceivedMessage) -> None:
        regions.calls.append(("east", m.message_id))
        started.set()
        assert release.wait(10)
        regions.calls.append(("east", m.message_id + " done"))

    return handler


def test_per_message_claims_never_start_message_2_while_1_runs_elsewhere(
    regions: Regions, clock: ManualClock
) -> None:
    """The open case: the secondary has message 2 at the head of its session (its copy of message
    1 never arrived: the region was down for that send) while the primary is still on message 1.
    It must wait for message 1 to complete, not start message 2."""
    _open_case(regions, clock)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_the_open_case_with_the_claim_log_on_cosmos(
    tmp_path: Path, clock: ManualClock, migrated_sqlite: Any, cosmos_claims_container: Any
) -> None:
    """The same interleaving with the claim log on the Cosmos-protocol server."""
    with _regions(tmp_path, clock, migrated_sqlite, CosmosClaimLog(cosmos_claims_container)) as r:
        _open_case(r, clock)


def _open_case(regions: Regions, clock: ManualClock) -> None:
    regions.faulty[1].outage()
    regions.geo.send([msg(1)])  # only east holds message 1
    regions.faulty[1].outage(False)
    regions.geo.send([msg(2)])
    started, release = threading.Event(), threading.Event()
    east = regions.consumer(0, _blocked_handler(regions, started, release))
    west = regions.consumer(1)
    runner = threading.Thread(target=east.run_once)  # east takes message 1 and hangs in it
    runner.start()
    assert started.wait(10)
    clock.advance(15)  # west's copy of message 2 is visible
    west.run_once()
    assert ("west", "m-s1-2") not in regions.calls, "message 2 started before message 1 ended"
    assert west.claimed is not None
    assert west.claimed.deferred == 1
    release.set()
    runner.join()
    clock.advance(LEASE + 1)  # west looks again once the lease it waited for would have ended
    drain(east, west)
    handled = [mid for _, mid in regions.calls if not mid.endswith("done")]
    assert handled == ["m-s1-1", "m-s1-2"]
    assert regions.empty()


def test_working_elsewhere_with_a_live_lease_is_left_alone_then_taken_over(
    regions: Regions, clock: ManualClock
) -> None:
    """A consumer that died inside the handler: its claim stays working until the lease ends,
    then the other region takes over (the lease is the window in which nothing else runs)."""
    regions.geo.send([msg(1)])
    key = message_key(Q, "m-s1-1")
    clock.advance(15)  # west's copy is visible; east took the claim and died just now
    assert regions.claims.claim(key, "dead-east", lease=_td(LEASE), at=clock.now()).won
    west = regions.consumer(1)
    west.run_once()
    assert regions.calls == []  # the lease is live: west leaves it alone
    clock.advance(LEASE)
    drain(west)
    assert regions.calls == [("west", "m-s1-1")]
    assert west.claimed is not None
    assert west.claimed.taken_over == 1
    entry = regions.claims.read(key)
    assert entry is not None
    assert (entry.status, entry.owner, entry.attempts) == (ClaimStatus.COMPLETED, "west", 2)


def _td(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def test_nothing_is_handled_without_a_claim_and_nothing_is_lost(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(1), msg(2)])
    claims = Switchable(regions.claims)
    east = regions.consumer(0, claims=claims)
    claims.down = True
    for _ in range(3):
        drain(east)
        clock.advance(1)
    assert regions.calls == []
    claims.down = False
    clock.advance(1)
    drain(east)
    assert regions.calls == [("east", "m-s1-1"), ("east", "m-s1-2")]


def test_a_claim_log_outage_after_the_handler_does_not_run_it_again(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(1)])
    claims = Switchable(regions.claims)
    real = claims.inner.complete
    flaky = [2]

    def complete(*a: Any, **k: Any) -> Any:
        if flaky[0]:
            flaky[0] -= 1
            raise ClaimLogUnavailableError("down for a moment")
        return real(*a, **k)

    claims.inner.complete = complete  # type: ignore[method-assign]
    east = regions.consumer(0, claims=claims)
    drain(east)
    clock.advance(20)
    drain(east, regions.consumer(1))
    assert regions.calls == [("east", "m-s1-1")]
    assert regions.empty()


def test_a_poison_message_is_failed_everywhere_and_unblocks_its_session(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(1), msg(2)])

    def handler(m: ReceivedMessage) -> None:
        regions.calls.append(("east", m.message_id))
        if m.message_id == "m-s1-1":
            raise UnprocessableMessageError("cannot parse")

    east, west = regions.consumer(0, handler), regions.consumer(1)
    drain(east)
    clock.advance(15)
    drain(east, west)
    assert regions.calls == [("east", "m-s1-1"), ("east", "m-s1-2")]
    entry = regions.claims.read(message_key(Q, "m-s1-1"))
    assert entry is not None
    assert entry.status is ClaimStatus.FAILED
    reasons = [d.reason for q in regions.queues for d in q.list_dead_letters(Q)]
    assert sorted(reasons) == sorted(["UnprocessableMessageError", FAILED_ELSEWHERE])


def test_a_retryable_failure_releases_the_claim_for_any_region(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(1)])

    def fails(_m: ReceivedMessage) -> None:
        raise RuntimeError("downstream busy")

    drain(regions.consumer(0, fails))
    entry = regions.claims.read(message_key(Q, "m-s1-1"))
    assert entry is not None
    assert (entry.status, entry.owner) == (ClaimStatus.PENDING, None)
    clock.advance(15)
    drain(regions.consumer(1))
    assert regions.calls == [("west", "m-s1-1")]


def test_the_claim_is_renewed_while_the_handler_runs(regions: Regions, clock: ManualClock) -> None:
    regions.geo.send([msg(1)])
    key = message_key(Q, "m-s1-1")
    stolen: list[bool] = []

    def slow(_m: ReceivedMessage) -> None:
        for _ in range(3):  # 3 x 8 s of handler time on a 10 s lease
            clock.advance(8)
            now = clock.now()

            def renewed(now: Any = now) -> bool:
                e = regions.claims.read(key)
                return (
                    e is not None
                    and e.lease_until is not None
                    and (e.lease_until - now > _td(LEASE / 2))
                )

            _wait(
                renewed,
                "the claim was not renewed",
            )
            stolen.append(regions.claims.claim(key, "west", lease=_td(LEASE), at=now).won)

    drain(regions.consumer(0, slow))
    assert stolen == [False, False, False]
    entry = regions.claims.read(key)
    assert entry is not None
    assert entry.status is ClaimStatus.COMPLETED


def test_session_granularity_keeps_a_session_in_one_region(
    regions: Regions, clock: ManualClock
) -> None:
    regions.geo.send([msg(1)])
    east = regions.consumer(0, granularity="session", claim_lease=30)
    west = regions.consumer(1, granularity="session", claim_lease=30)
    drain(east)
    regions.geo.send([msg(2)])  # east's session claim lives on: west leaves message 2 alone
    clock.advance(15)
    drain(west)
    assert regions.calls == [("east", "m-s1-1")]
    session = regions.claims.read(session_key(Q, "s1"))
    assert session is not None
    assert session.owner == "east"
    drain(east)
    clock.advance(30)
    drain(east, west)
    assert regions.calls == [("east", "m-s1-1"), ("east", "m-s1-2")]
    assert regions.empty()


def test_bad_settings_are_refused(regions: Regions) -> None:
    with pytest.raises(ConfigurationError, match="granularity"):
        regions.consumer(0, granularity="row")
    with pytest.raises(ConfigurationError, match="inbox"):
        regions.consumer(0, inbox=True)


def test_session_granularity_a_region_waiting_for_an_earlier_message_leaves_the_session(
    regions: Regions, clock: ManualClock
) -> None:
    """East lacks message 1 (down for that send) and holds message 2; west holds both. East must
    not keep the session while it waits for message 1, or west could never handle it."""
    regions.faulty[0].outage()
    regions.geo.send([msg(1)])
    regions.faulty[0].outage(False)
    regions.geo.send([msg(2)])
    east = regions.consumer(0, granularity="session")
    west = regions.consumer(1, granularity="session")
    for _ in range(60):
        drain(east, west)
        if regions.empty():
            break
        clock.advance(1)
    assert [mid for _, mid in regions.calls] == ["m-s1-1", "m-s1-2"]
    assert regions.empty()


@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_deferred_message_releases_its_claim(
    regions: Regions, clock: ManualClock, how: str
) -> None:
    regions.geo.send([msg(1)])

    def later(_m: ReceivedMessage) -> DeferMessage:
        if how == "raise":
            raise DeferMessage("waiting for the customs form")
        return DeferMessage("waiting for the customs form")

    drain(regions.consumer(0, later))  # type: ignore[arg-type]
    entry = regions.claims.read(message_key(Q, "m-s1-1"))
    assert entry is not None
    assert (entry.status, entry.owner) == (ClaimStatus.PENDING, None)
    [deferred] = regions.queues[0].receive_deferred(
        Q, [regions.queues[0].peek(Q)[0].sequence_number]
    )
    assert deferred.message_id == "m-s1-1"

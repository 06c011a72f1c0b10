"""GeoReplicatedTransport: the shipped transport contract over two regions, the delayed secondary
copy, settlement with one region down, and registration in the claim log before any send."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.claims.ports import ClaimStatus, message_key, session_key
from dispatcher.claims.sql import SqlClaimLog
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import Transport, TransportMessage
from dispatcher.transports.geo import GeoReplicatedTransport
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.transports.sql import SqlQueueTransport
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    ClaimLogUnavailableError,
    ClosedError,
    PermanentTransportError,
    RetryableTransportError,
)
from outbox.testing.contracts.transport import DEST, TransportContract, msg
from outbox.testing.faulty import FaultyTransport


class TestGeoReplicatedTransport(TransportContract):
    """Two in-memory regions; what a consumer of the primary region receives."""

    def make_transport(self) -> Transport:
        return GeoReplicatedTransport(
            InMemoryTransport(destinations=[DEST]), InMemoryTransport(destinations=[DEST])
        )

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        assert isinstance(transport, GeoReplicatedTransport)
        primary = transport.regions[0]
        assert isinstance(primary, InMemoryTransport)
        return primary.messages(destination)


class TestGeoReplicatedTransportWithClaims(TestGeoReplicatedTransport):
    """The same, registering every session's messages in a SQL claim log first."""

    @pytest.fixture(autouse=True)
    def _claims(self, tmp_path: Path, migrated_sqlite: Any) -> Iterator[None]:
        self.claims = SqlClaimLog(migrated_sqlite(tmp_path / "claims.db"))
        yield
        self.claims.close()

    def make_transport(self) -> Transport:
        return GeoReplicatedTransport(
            InMemoryTransport(destinations=[DEST]),
            InMemoryTransport(destinations=[DEST]),
            claims=self.claims,
            # The contract's six concurrent senders queue for SQLite's one write lock: on a
            # loaded machine a wait passed the default bound (1 s) and that send failed,
            # retryably, as the bound promises. Concurrency is what this proves, not the bound
            # (tests/claims/test_claim_log_timeout.py does that), so the bound is wide here.
            claim_log_timeout=60.0,
        )


def _regions() -> tuple[InMemoryTransport, InMemoryTransport]:
    return InMemoryTransport(destinations=[DEST]), InMemoryTransport(destinations=[DEST])


def test_both_regions_get_the_same_ids_and_sessions_the_secondary_later(
    clock: ManualClock,
) -> None:
    east, west = _regions()
    geo = GeoReplicatedTransport(east, west, "15s", clock=clock)
    later = clock.now() + timedelta(seconds=100)
    geo.send([msg(1), msg(2, scheduled_at=later)])
    assert [(m.message_id, m.session_id) for m in east.deliveries] == [
        (m.message_id, m.session_id) for m in west.deliveries
    ]
    assert [m.scheduled_at for m in east.deliveries] == [None, later]
    assert [m.scheduled_at for m in west.deliveries] == [
        clock.now() + timedelta(seconds=15),
        later + timedelta(seconds=15),
    ]
    assert geo.missed == [0, 0]


def test_the_secondary_queue_delivers_its_copy_only_after_the_delay(
    tmp_path: Path, clock: ManualClock, migrated_sqlite: Any
) -> None:
    queues = [
        SqlQueue(migrated_sqlite(tmp_path / f"{name}.db"), clock=clock) for name in ("east", "west")
    ]
    geo = GeoReplicatedTransport(
        SqlQueueTransport(queues[0]), SqlQueueTransport(queues[1]), "15s", clock=clock
    )
    geo.send([msg(1)])
    assert [m.message_id for m in queues[0].receive(DEST)] == ["m-s1-1"]
    assert queues[1].receive(DEST) == []
    clock.advance(15)
    assert [m.message_id for m in queues[1].receive(DEST)] == ["m-s1-1"]
    geo.close()
    for q in queues:
        q.close()


@pytest.mark.parametrize("down", [0, 1])
def test_a_region_down_does_not_stop_sending(clock: ManualClock, down: int) -> None:
    east, west = _regions()
    faulty = [FaultyTransport(east), FaultyTransport(west)]
    faulty[down].outage()
    geo = GeoReplicatedTransport(faulty[0], faulty[1], clock=clock, region_backoff="30s")
    geo.send([msg(1)])  # settled: the other region holds it
    geo.send([msg(2)])  # the region that failed is skipped for 30 s (no timeout per send)
    assert faulty[down].calls == 1
    up = (east, west)[1 - down]
    assert [m.message_id for m in up.deliveries] == ["m-s1-1", "m-s1-2"]
    assert geo.missed[down] == 2
    faulty[down].outage(False)
    clock.advance(31)  # tried again after the backoff: it gets new messages, not old ones
    geo.send([msg(3)])
    assert [m.message_id for m in (east, west)[down].deliveries] == ["m-s1-3"]
    assert geo.missed[down] == 2


def test_both_regions_down_is_a_retryable_failure(clock: ManualClock) -> None:
    east, west = _regions()
    a, b = FaultyTransport(east), FaultyTransport(west)
    a.outage()
    b.outage()
    geo = GeoReplicatedTransport(a, b, clock=clock)
    with pytest.raises(RetryableTransportError, match="no region took") as err:
        geo.send([msg(1)])
    assert err.value.message_id == "m-s1-1"
    a.outage(False)
    b.outage(False)
    geo.send([msg(1)])  # the outbox re-sends: both are tried even inside the backoff
    assert len(east.deliveries) == len(west.deliveries) == 1


def test_claims_are_registered_in_batch_order_before_sending(
    tmp_path: Path, clock: ManualClock, migrated_sqlite: Any
) -> None:
    claims = SqlClaimLog(migrated_sqlite(tmp_path / "claims.db"))
    east, west = _regions()
    geo = GeoReplicatedTransport(east, west, claims=claims, clock=clock)
    geo.send([msg(1), msg(2), msg(1, "other")])
    geo.send([msg(2), msg(3)])  # a re-send keeps its position
    entries = [claims.read(message_key(DEST, f"m-s1-{i}")) for i in (1, 2, 3)]
    assert [e.position if e else None for e in entries] == [0, 1, 2]
    assert all(e is not None and e.session == session_key(DEST, "s1") for e in entries)
    # messages both regions refused for good are failed in the log, so they block nothing
    with pytest.raises(PermanentTransportError):
        geo.send([msg(4, destination="no such destination!")])
    refused = claims.read(message_key("no such destination!", "m-s1-4"))
    assert refused is not None
    assert refused.status is ClaimStatus.FAILED
    claims.close()


def test_an_unreachable_claim_log_sends_nothing(clock: ManualClock) -> None:
    class Down:
        def register(self, *_a: object, **_k: object) -> None:
            raise ClaimLogUnavailableError("the claim log is down")

    east, west = _regions()
    geo = GeoReplicatedTransport(east, west, claims=Down(), clock=clock)  # type: ignore[arg-type]
    with pytest.raises(RetryableTransportError, match="claim log"):
        geo.send([msg(1)])
    assert east.deliveries == west.deliveries == []


def test_a_skipped_region_is_tried_when_the_other_fails(clock: ManualClock) -> None:
    east, west = _regions()
    a, b = FaultyTransport(east), FaultyTransport(west)
    geo = GeoReplicatedTransport(a, b, clock=clock, region_backoff="30s")
    a.outage()
    geo.send([msg(1)])  # east fails: skipped for 30 s
    a.outage(False)
    b.outage()
    geo.send([msg(2)])  # west fails now: east is tried at once rather than nothing settling
    assert [m.message_id for m in east.deliveries] == ["m-s1-2"]
    assert [m.message_id for m in west.deliveries] == ["m-s1-1"]
    geo.close()
    with pytest.raises(ClosedError):
        geo.send([msg(3)])


def test_any_two_transports_a_sql_queue_and_service_bus(
    tmp_path: Path, clock: ManualClock, migrated_sqlite: Any
) -> None:
    """The secondary on Service Bus (the SDK fake): the same ids and session, and its copy
    scheduled ``secondary_delay`` later through scheduled_enqueue_time_utc."""
    pytest.importorskip("azure.servicebus")
    from dispatcher.servicebus.transport import ServiceBusTransport
    from tests.dispatcher.test_servicebus import FakeNamespace, FakeServiceBusClient

    ns = FakeNamespace()
    ns.create(DEST)
    bus = ServiceBusTransport(FakeServiceBusClient(ns))
    queue = SqlQueue(migrated_sqlite(tmp_path / "east.db"), clock=clock)
    geo = GeoReplicatedTransport(SqlQueueTransport(queue), bus, "15s", clock=clock)
    geo.send([msg(1), msg(2)])
    [copy1, copy2] = [s.message for s in ns.entities[DEST].stored]
    assert [copy1.message_id, copy2.message_id] == ["m-s1-1", "m-s1-2"]
    assert copy1.session_id == copy2.session_id == "s1"
    assert copy1.scheduled_enqueue_time_utc == clock.now() + timedelta(seconds=15)
    assert [m.message_id for m in queue.peek(DEST)] == ["m-s1-1", "m-s1-2"]
    geo.close()
    bus.close()
    queue.close()

"""The kit's transport contract (``outbox.testing.contracts.transport``) run against the in-memory
transport and the SQL queue transport (SQLite and a real PostgreSQL server)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import Transport, TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.transports.sql import SqlQueueTransport
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.testing.contracts.transport import DEST, TransportContract


class TestInMemoryTransport(TransportContract):
    def make_transport(self) -> Transport:
        return InMemoryTransport(destinations=[DEST])

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        assert isinstance(transport, InMemoryTransport)
        return transport.messages(destination)


class TestInMemoryTransportWithDuplicateDetection(TestInMemoryTransport):
    def make_transport(self) -> Transport:
        return InMemoryTransport(destinations=[DEST], detect_duplicates=True)

    def test_duplicates_are_dropped(self) -> None:
        t = InMemoryTransport(detect_duplicates=True)
        m = TransportMessage(message_id="x", destination=DEST, body=b"1")
        t.send([m])
        t.send([m])
        assert t.message_ids() == ["x"]
        assert t.duplicates_dropped == 1


class TestSqlQueueTransport(TransportContract):
    @pytest.fixture(autouse=True)
    def _queue(self, sql_url: str) -> Iterator[None]:
        upgrade(sql_url)
        self.clock = ManualClock()
        self.queue = SqlQueue(sql_url, clock=self.clock)
        yield
        self.queue.close()

    def make_transport(self) -> Transport:
        return SqlQueueTransport(self.queue)

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        # Everything the queue holds, in acceptance (sequence) order, as a consumer would see it.
        out = []
        self.clock.advance(10**6)  # past any scheduled time
        for p in self.queue.peek(destination, limit=10_000):
            out.append(
                TransportMessage(
                    message_id=p.message_id,
                    destination=destination,
                    body=p.body,
                    subject=p.subject,
                    content_type=p.content_type,
                    session_id=p.session_id,
                )
            )
        return out

    def test_send_settles_and_keeps_every_field(self) -> None:
        t = self.make_transport()
        m = TransportMessage(
            message_id="m1",
            destination=DEST,
            body=b"{}",
            subject="Thing",
            session_id="s1",
            correlation_id="corr-1",
            headers={"traceparent": "00-abc-def-01"},
        )
        t.send([m])
        got = self.queue.receive(DEST, 1)
        assert got[0].correlation_id == "corr-1"
        assert got[0].headers == {"traceparent": "00-abc-def-01"}
        assert got[0].session_id == "s1"
        assert got[0].subject == "Thing"

    def test_scheduled_time_is_honoured(self) -> None:
        t = self.make_transport()
        later = self.clock.now() + timedelta(seconds=60)
        t.send([TransportMessage(message_id="m1", destination=DEST, body=b"1", scheduled_at=later)])
        assert self.queue.receive(DEST, 1) == []
        self.clock.advance(61)
        assert [r.message_id for r in self.queue.receive(DEST, 1)] == ["m1"]

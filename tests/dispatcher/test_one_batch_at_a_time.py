"""Coalesced (one-transaction) batches go to the transport one at a time: 200 batches on 16
threads at once convoyed on SQLite's single write lock and the GIL (the superlinear cost of a
100,000-document unit of work, docs/performance-write-path.md)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from dispatcher.dispatch import Dispatcher
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from tests.dispatcher.test_key_order import Marks, row


class Overlap(InMemoryTransport):
    """Records how many sends were in flight at once; each send waits for a second one to
    arrive (a condition, with a short deadline), so sends overlap whenever the dispatcher
    lets them."""

    atomic_batches = True

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.in_flight = 0
        self.most = 0

    def send(self, batch: Sequence[TransportMessage]) -> None:
        with self._arrived:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self._arrived.notify_all()
            self._arrived.wait_for(lambda: self.in_flight > 1, timeout=0.05)
        try:
            super().send(batch)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_coalesced_batches_are_sent_one_at_a_time() -> None:
    transport = Overlap()
    d = Dispatcher(Marks(), transport, max_in_flight=8, max_batch_messages=2, coalesce=True)
    report = d.dispatch([row(f"doc{i}", None) for i in range(12)])  # 6 batches of 2 documents
    d.close()
    assert report.ok
    assert report.messages_sent == 12
    assert transport.most == 1

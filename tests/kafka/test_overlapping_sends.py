"""A dispatch of many documents to a real broker goes as shared sends of up to
``max_batch_messages`` in flight together (issue 45; 250 here): every record arrives once and is
marked, and a key that spans two of the sends keeps its order in its partition (the second send
holding it waits for the first's turn)."""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.dispatch import Dispatcher
from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.mapping import record_of
from dispatcher.kafka.transport import KafkaTransport
from outbox.core.model import DocumentRow, OutboxMessage
from testkit.kafka import KafkaBroker, read_records

#: The shared sends' size here (``max_batch_messages``): four sends for a thousand documents.
SEND = 250


class _Marks:
    def __init__(self) -> None:
        self.marks: dict[str, int] = {}

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None:
        self.marks.update(marks)
        return 1


def _row(topic: str, i: int) -> DocumentRow:
    # the first two documents of the first two sends share a key (those two sends go one after
    # the other); the rest have keys of their own (the other sends overlap)
    key = "shared" if i % SEND in (0, 1) and i < 2 * SEND else None
    m = OutboxMessage(1, f"m{i:04}", topic, "T", "{}", ordering_key=key)
    return DocumentRow(f"d{i:04}", "t", 1, {}, 1, 0, [m])


def test_a_large_dispatch_overlaps_its_sends_and_keeps_a_shared_keys_order(
    kafka: KafkaBroker, topic: str
) -> None:
    n = 3 * SEND + 10  # four shared sends
    transport = KafkaTransport(KafkaConfig(kafka.bootstrap, send_timeout=30))
    marks = _Marks()
    d = Dispatcher(marks, transport, max_in_flight=4, max_batch_messages=SEND)
    try:
        report = d.dispatch([_row(topic, i) for i in range(n)])
    finally:
        d.close()
        transport.close()
    assert report.failed == []
    assert report.messages_sent == n
    assert len(marks.marks) == n
    records = [record_of(r) for r in read_records(kafka.bootstrap, topic)]
    assert sorted(r.message_id for r in records) == [f"m{i:04}" for i in range(n)]
    shared = [r.message_id for r in records if r.session_id == "shared"]
    assert shared == ["m0000", "m0001", f"m{SEND:04}", f"m{SEND + 1:04}"]

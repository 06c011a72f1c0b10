"""The coalesced watermark (dispatcher/watermarks.py): marks written off the caller's path, riding
along in the next save or written once per window, flushed on reads and on close; a crash before
they are written only means re-sends with the same ids, and a mark never precedes its send."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dispatcher.invariants import verify_deliveries
from dispatcher.transports.base import TransportMessage
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.watermarks import WatermarkWriter
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.errors import RetryableTransportError, StoreError
from outbox.core.model import OutboxMessage
from outbox.testing.tables import current_rows
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import QueueSink
from tests.dispatcher.helpers import write_docs

LONG = 5.0  # a window no test waits for: marks are written by a save, a read, a flush or close


def open_ob(workspace: Path, clock: ManualClock, transport: object) -> Outbox:
    return Outbox.open(
        workspace,
        clock=clock,
        transport=transport,  # type: ignore[arg-type]
        default_destination="shipments",
        buckets=4,
        watermark_window=LONG,
    )


def marks_in_table(ob: Outbox) -> dict[str, int]:
    """``dispatched_seq`` as stored, read past the store (whose reads flush the writer first)."""
    rows = current_rows(ob.store.delta_table, ["id", "dispatched_seq"])
    return {doc_id: int(r["dispatched_seq"]) for doc_id, r in rows.items()}


def test_marks_ride_along_in_the_next_save_then_a_read_flushes_the_rest(
    workspace: Path, clock: ManualClock
) -> None:
    ob = open_ob(workspace, clock, InMemoryTransport())
    with ob:
        for i in range(3):  # creates only (a unit of work's own reads do not flush either)
            with ob.unit_of_work() as uow:
                doc = uow.create(f"d{i}-0", type="t")
                doc.send("A", {})
                doc.send("B", {})
        writer = ob.runtime.watermarks
        assert writer is not None
        assert ob.runtime.metrics["watermark_merges"] == 0  # no watermark commit of its own
        assert writer.carried == 2  # d0's mark rode in d1's save, d1's in d2's
        assert marks_in_table(ob) == {"d0-0": 2, "d1-0": 2, "d2-0": 0}
        _, rows = ob.store.read(["d2-0"])  # a read sees every mark this process earned
        assert rows["d2-0"].dispatched_seq == 2
        assert ob.runtime.metrics["watermark_merges"] == 1


def test_close_flushes_the_waiting_marks(workspace: Path, clock: ManualClock) -> None:
    ob = open_ob(workspace, clock, InMemoryTransport())
    with ob:
        write_docs(ob, {}, 3, 2)
        assert set(marks_in_table(ob).values()) == {0}
    again = Outbox.open(workspace, clock=clock, transport="memory", watermark_window=0)
    with again:
        assert marks_in_table(again) == {"pkg0": 2, "pkg1": 2, "pkg2": 2}


def test_a_crash_before_the_marks_are_written_costs_re_sends_the_consumer_drops(
    workspace: Path, clock: ManualClock
) -> None:
    memory = InMemoryTransport()
    ob = open_ob(workspace, clock, memory)
    with ob:
        committed: dict[str, list[OutboxMessage]] = {}
        write_docs(ob, committed, 3, 2)
        writer = ob.runtime.watermarks
        assert writer is not None
        assert writer.abandon() == 3  # the process dies: its marks were never written
        assert len(memory.deliveries) == 6
        sink = QueueSink(ob.runtime.queue, ob.settings.command_queue)
        ts = int(ob.store.delta_table.history(1)[0]["timestamp"])
        later = ManualClock(datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(minutes=1))
        rescue = RescuePass(ob.store, LocalEngine(), InMemoryCheckpointStore(), sink, clock=later)
        assert rescue.run(full=True).commands_enqueued == 3
        DispatcherWorker(ob.runtime, batch_size=8, poll_interval=1.0).run(until_idle=True)
        report = verify_deliveries(committed, memory.deliveries)
        assert report.ok, report.describe()  # nothing lost, first deliveries in order
        assert report.duplicates == 6  # every message re-sent, with its own id: dropped by id
        assert marks_in_table(ob) == {"pkg0": 2, "pkg1": 2, "pkg2": 2}


class Refusing:
    """A transport that takes nothing (the broker is down)."""

    def send(self, batch: Sequence[TransportMessage]) -> None:
        raise RetryableTransportError("down", message_id=batch[0].message_id)

    def close(self) -> None:
        pass


def test_a_mark_never_covers_a_message_the_transport_did_not_take(
    workspace: Path, clock: ManualClock
) -> None:
    ob = open_ob(workspace, clock, Refusing())
    with ob:
        write_docs(ob, {}, 2, 2)
        writer = ob.runtime.watermarks
        assert writer is not None
        assert writer.flush(30)
        write_docs(ob, {}, 1, 1, prefix="later-")  # a save that would carry any waiting mark
        assert writer.flush(30)
        assert set(marks_in_table(ob).values()) == {0}


class FailingOnce:
    def __init__(self) -> None:
        self.calls: list[dict[str, int]] = []

    def advance_watermarks(
        self, marks: Mapping[str, int], incarnations: Mapping[str, str | None] | None = None
    ) -> int | None:
        self.calls.append(dict(marks))
        if len(self.calls) == 1:
            raise StoreError("the table is unreachable")
        return 7


def test_a_failed_write_keeps_the_marks_and_merges_them_with_newer_ones() -> None:
    store = FailingOnce()
    writer = WatermarkWriter(store, window=LONG, retry_seconds=LONG)
    writer.submit({"a": (2, "x"), "b": (1, "y")})
    assert not writer.flush(30)  # the write failed: reported, the marks kept
    assert writer.covered([("a", "x"), ("a", "z"), ("b", "y")]) == {"a": 2, "b": 1}
    writer.submit({"a": (3, "x")})
    assert writer.flush(30)
    assert store.calls == [{"a": 2, "b": 1}, {"a": 3, "b": 1}]
    assert writer.pending() == 0
    writer.close()


def test_a_mark_applies_only_to_the_life_it_was_sent_for(
    workspace: Path, clock: ManualClock
) -> None:
    """A document deleted and created again restarts at seq 1: its predecessor's mark, written
    late, must not mark the new life's messages as sent (a loss)."""
    ob = open_ob(workspace, clock, InMemoryTransport())
    with ob:
        write_docs(ob, {}, 1, 1, prefix="late-")  # makes the table and dispatches late-0 seq 1
        with ob.unit_of_work() as uow:
            uow.create("a", type="t").send("X", {})
        _, rows = ob.store.read(["a"])
        life = rows["a"].incarnation
        ob.store.advance_watermarks({"a": 5}, {"a": "an-older-life"})  # a row of that life
        assert marks_in_table(ob)["a"] == 1  # which is not the document's
        assert ob.store.advance_watermarks({"a": 5}, {"a": life}) is not None
        assert marks_in_table(ob)["a"] == 5

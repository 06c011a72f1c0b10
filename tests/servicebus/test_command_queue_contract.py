"""The shipped queue contract against the Service Bus command queue on the kit's fake broker.

The flags and overrides below are where Service Bus semantics differ from the SQL queue, each
documented in docs/servicebus.md:

* ``send`` cannot report dropped duplicates (the service answers success either way), so the
  duplicate tests check what is stored instead of the returned ids;
* the broker forgets duplicate ids by itself (no ``forget_expired_duplicates`` to call);
* a delayed abandon is a scheduled copy, so it does not hold the rest of the session;
* runtime properties have no deferred count (deferred messages count as active);
* runtime properties count locked messages as active and are per entity;
* no receive-and-delete for commands.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from outbox.core.clock import ManualClock
from outbox.testing.contracts import queue as contract
from outbox.testing.contracts.queue import QueueContract, msg
from tests.servicebus.fakes import InspectableQueue, namespace

NAMES = ("q", "orders", "other", "one", "two", "a", "b")


class TestServiceBusCommandQueue(QueueContract):
    supports_receive_and_delete = False
    supports_duplicate_cleanup = False
    supports_deferred_count = False

    def make_queue(self, clock: ManualClock) -> Any:
        self.bus = namespace(
            clock,
            *NAMES,
            lock_duration=contract.LOCK_DURATION,
            max_delivery_count=contract.MAX_DELIVERY_COUNT,
            window=contract.DUPLICATE_DETECTION_WINDOW,
        )
        return self._queue(clock)

    def _queue(self, clock: ManualClock) -> InspectableQueue:
        return InspectableQueue(
            self.bus,
            command_queue="q",
            clock=clock,
            lock_duration=contract.LOCK_DURATION,
            max_delivery_count=contract.MAX_DELIVERY_COUNT,
            max_body_bytes=contract.MAX_BODY_BYTES,
        )

    def reopen_queue(self) -> Any:
        return self._queue(self.bus.clock)  # type: ignore[arg-type]

    # --- where Service Bus differs ---------------------------------------------------------------

    def test_duplicate_inside_window_is_accepted_and_dropped(
        self, queue: Any, clock: ManualClock
    ) -> None:
        queue.send("q", msg("d1"))
        clock.advance(599)
        queue.send("q", msg("d1"))  # accepted, no error, no copy (and not reported)
        queue.send("q", [msg("d1"), msg("d2"), msg("d2")])
        assert [p.message_id for p in queue.peek("q")] == ["d1", "d2"]
        queue.send("other", msg("d1"))
        assert [p.message_id for p in queue.peek("other")] == ["d1"]

    def test_duplicate_after_window_is_a_new_message(self, queue: Any, clock: ManualClock) -> None:
        queue.send("q", msg("d1"))
        queue.complete(queue.receive("q")[0])
        clock.advance(601)  # the broker forgets the id by itself
        queue.send("q", msg("d1"))
        assert len(queue.peek("q")) == 1

    def test_duplicate_of_completed_message_inside_window_is_dropped(self, queue: Any) -> None:
        queue.send("q", msg("x"))
        queue.complete(queue.receive("q")[0])
        queue.send("q", msg("x"))
        assert queue.receive("q") == []

    def test_abandon_with_delay_holds_the_whole_session(
        self, queue: Any, clock: ManualClock
    ) -> None:
        """Differs: the retry is a scheduled copy, so a2 runs while a1 waits (harmless for
        ProcessDocument: any command sends everything pending of its document)."""
        queue.send("q", [msg("a1", "A"), msg("a2", "A")])
        queue.abandon(queue.receive("q")[0], delay=10)
        [a2] = queue.receive("q", 10)
        assert a2.message_id == "a2"
        queue.complete(a2)
        assert queue.receive("q", 10) == []
        clock.advance(10)
        [a1] = queue.receive("q", 10)
        assert (a1.message_id, a1.session_id, a1.delivery_count) == ("a1", "A", 2)

    def test_stats_per_queue(self, queue: Any, clock: ManualClock) -> None:
        queue.send("q", [msg("a"), msg("b"), msg("c", not_before=clock.now() + timedelta(hours=1))])
        queue.receive("q")
        queue.dead_letter(queue.receive("q")[0], "R")
        stats = queue.stats()["q"]  # locked messages count as active
        assert (stats.active, stats.scheduled, stats.locked, stats.dead_lettered) == (1, 1, 0, 1)
        assert list(queue.stats("one")) == []


def test_a_copy_past_the_limit_is_dead_lettered_on_receive() -> None:
    clock = ManualClock()
    bus = namespace(clock, "q", max_delivery_count=3)
    queue = InspectableQueue(bus, command_queue="q", clock=clock, max_delivery_count=3)
    queue.send("q", msg("a", "S"))
    for expected in (1, 2):
        [m] = queue.receive("q")
        assert m.delivery_count == expected
        queue.abandon(m, delay=5)
        clock.advance(5)
    [m] = queue.receive("q")
    assert m.delivery_count == 3
    clock.advance(30)  # the lock of the copy expires: the broker counts 2, we count 4
    assert queue.receive("q") == []
    [dl] = queue.list_dead_letters()
    assert (dl.message_id, dl.reason) == ("a", "MaxDeliveryCountExceeded")


def test_a_repeated_delayed_abandon_schedules_one_copy() -> None:
    """A crash between scheduling the copy and completing the original redelivers the original
    with the same count; its copy has the same derived id, which duplicate detection drops."""
    clock = ManualClock()
    bus = namespace(clock, "q")
    queue = InspectableQueue(bus, command_queue="q", clock=clock)
    queue.send("q", msg("a", "S"))
    [m] = queue.receive("q")
    sender = bus.client().get_queue_sender("q")
    from dispatcher.servicebus.commands import derived_id

    queue._send_sdk("q", [queue._to_sdk(msg(derived_id("a", "1"), "S"))])  # the copy of a crash
    queue.abandon(m, delay=5)
    assert [s.message_id for s in bus.messages("q")] == ["a+1"]
    sender.close()


def test_the_workers_lock_renewer_keeps_a_session() -> None:
    """The worker's ``LockRenewer`` renews a Service Bus command through its session lock."""
    import threading
    from datetime import datetime

    from dispatcher.queue.lock_renewer import LockRenewer
    from dispatcher.queue.messages import ReceivedMessage

    renewed = threading.Event()

    class Signalling(InspectableQueue):
        def renew_lock(self, target: ReceivedMessage | str) -> datetime:
            until = super().renew_lock(target)
            renewed.set()
            return until

    clock = ManualClock()
    bus = namespace(clock, "q")
    queue = Signalling(bus, command_queue="q", clock=clock)
    queue.send("q", msg("a", "S"))
    [m] = queue.receive("q")
    with LockRenewer(queue, lambda: [m], clock, check_interval=0.001):
        clock.advance(20)  # past half the lock: the renewer renews
        assert renewed.wait(10)
    clock.advance(20)  # 40 s after the receive, 20 s after the renewal
    queue.complete(m)
    assert bus.messages("q") == []

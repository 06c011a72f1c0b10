"""Who gets the gateway's free places (dispatcher/mqtt/places.py): the task that became ready
first, a first try since it was enqueued, a retry since its last try ran out. The gateway with a
real broker: tests/mqtt/test_gateway.py (``..._when_the_places_are_few``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dispatcher.mqtt.places import Places
from dispatcher.queue.messages import ReceivedMessage

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _task(seq: int, device: str, *, tries: int, enqueued: float) -> ReceivedMessage:
    """A received task (``tries``: its delivery count with this receive)."""
    return ReceivedMessage(
        queue="devices",
        message_id=f"{device}-t0",
        body=b"{}",
        sequence_number=seq,
        enqueued_at=T0 + timedelta(seconds=enqueued),
        delivery_count=tries,
        lock_token="token",
        locked_until=T0 + timedelta(seconds=100),
        session_id=device,
    )


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_place_goes_to_the_task_ready_first_not_to_the_oldest_in_the_line() -> None:
    places = Places()
    for device in ("silent0", "silent1"):
        places.take((device, f"{device}-t0"), _at(0), _at(0.5))
    assert places.held(_at(0.4)) == 2
    assert places.held(_at(0.5)) == 0, "their tries ran out: the places are free"
    line = [
        (_task(1, "silent0", tries=2, enqueued=0), "p1"),  # retries: ready since 0.5
        (_task(2, "silent1", tries=2, enqueued=0), "p2"),
        (_task(3, "acking", tries=1, enqueued=0.1), "p3"),  # a first try: ready since 0.1
        (_task(4, "late", tries=1, enqueued=0.7), "p4"),  # enqueued after the lapse
    ]
    chosen, passed = places.choose(line, 2, _at(0.8))
    assert [m.session_id for m, _ in chosen] == ["silent0", "acking"], "in the line's order"
    assert [m.session_id for m in passed] == ["silent1", "late"]
    # a passed-over retry keeps its readiness: it goes before the task enqueued after its lapse
    chosen, _ = places.choose([line[1], line[3]], 1, _at(0.9))
    assert [m.session_id for m, _ in chosen] == ["silent1"]


def test_a_retry_this_process_did_not_try_counts_from_now() -> None:
    """Another process's try, or one before a restart: its lapse is not known here."""
    places = Places()
    line = [
        (_task(1, "elsewhere", tries=3, enqueued=0), "p1"),
        (_task(2, "fresh", tries=1, enqueued=5), "p2"),
    ]
    chosen, passed = places.choose(line, 1, _at(6))
    assert [m.session_id for m, _ in chosen] == ["fresh"]
    assert [m.session_id for m in passed] == ["elsewhere"]


def test_the_line_past_the_tasks_in_hand_is_looked_at_only_when_it_could_win() -> None:
    places = Places()
    places.take(("silent0", "silent0-t0"), _at(0), _at(0.5))
    places.held(_at(0.5))
    retry = [(_task(1, "silent0", tries=2, enqueued=0), "p1")]
    first = [(_task(2, "a", tries=1, enqueued=0.1), "p2")]
    assert not places.enough(retry, 1, _at(0.6), last=_at(0)), "a task enqueued by 0.5 wins"
    assert places.enough(retry, 1, _at(0.6), last=_at(0.5))
    assert places.enough(first, 1, _at(0.6), last=_at(0.1)), "first tries in hand: enough"
    assert not places.enough(first, 2, _at(0.6), last=_at(0.1)), "fewer in hand than places"


def test_an_offline_device_or_a_settled_task_holds_no_place() -> None:
    places = Places()
    places.take(("a", "a-t0"), _at(0), _at(10))
    places.take(("b", "b-t0"), _at(0), _at(10))
    assert places.release(("a", "a-t0")) is not None
    assert places.release(("a", "a-t0")) is None
    places.release_devices({"b"})
    assert places.held(_at(1)) == 0
    assert len(places) == 0

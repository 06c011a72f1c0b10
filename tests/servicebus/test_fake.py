"""The kit's Service Bus fake on its own: each documented receive-side behaviour, through the SDK
surface (real ``ServiceBusMessage`` and exception classes), as docs/servicebus.md lists them."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("azure.servicebus")

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus import exceptions as sb_errors

from outbox.core.clock import ManualClock
from outbox.testing.servicebus_fake import FakeServiceBus


@pytest.fixture
def bus() -> FakeServiceBus:
    fake = FakeServiceBus(ManualClock())
    fake.create_queue("q", max_delivery_count=2, lock_duration=timedelta(seconds=30))
    return fake


def send(bus: FakeServiceBus, mid: str, session: str | None = "S", **kw: object) -> None:
    bus.client().get_queue_sender("q").send_messages(
        ServiceBusMessage(b"x", message_id=mid, session_id=session, **kw)  # type: ignore[arg-type]
    )


def test_a_session_queue_refuses_a_message_without_session(bus: FakeServiceBus) -> None:
    with pytest.raises(sb_errors.ServiceBusError, match="SessionId was not set"):
        send(bus, "m", session=None)


def test_next_available_session_and_session_locks(bus: FakeServiceBus) -> None:
    client = bus.client()
    with pytest.raises(sb_errors.OperationTimeoutError):
        client.get_queue_receiver("q", session_id=NEXT_AVAILABLE_SESSION).receive_messages()
    send(bus, "a1")
    first = client.get_queue_receiver("q", session_id=NEXT_AVAILABLE_SESSION)
    [m] = first.receive_messages()
    assert (m.session_id, m.delivery_count) == ("S", 0)  # the AMQP header: deliveries - 1
    with pytest.raises(sb_errors.SessionCannotBeLockedError):
        client.get_queue_receiver("q", session_id="S").receive_messages()
    with pytest.raises(TypeError, match="renew the session lock"):
        first.renew_message_lock(m)
    assert first.session is not None
    assert first.session.renew_lock() == bus.now() + timedelta(seconds=30)
    bus.clock.advance(30)  # type: ignore[attr-defined]
    with pytest.raises(sb_errors.SessionLockLostError):
        first.complete_message(m)
    [again] = client.get_queue_receiver("q", session_id="S").receive_messages()
    assert again.delivery_count == 1  # the expired lock counted a delivery


def test_closing_without_settling_does_not_count(bus: FakeServiceBus) -> None:
    send(bus, "a1")
    receiver = bus.client().get_queue_receiver("q", session_id="S")
    [m] = receiver.receive_messages()
    receiver.close()
    with pytest.raises(ValueError, match="shutdown"):
        receiver.complete_message(m)
    [m] = bus.client().get_queue_receiver("q", session_id="S").receive_messages()
    assert m.delivery_count == 0


def test_max_delivery_count_moves_to_the_dead_letter_subqueue(bus: FakeServiceBus) -> None:
    send(bus, "a1")
    send(bus, "a2")
    for _ in range(2):  # max_delivery_count=2
        receiver = bus.client().get_queue_receiver("q", session_id="S")
        [m] = receiver.receive_messages()
        receiver.abandon_message(m)
        with pytest.raises(sb_errors.MessageAlreadySettled):
            receiver.complete_message(m)
        receiver.close()
    [next_one] = bus.client().get_queue_receiver("q", session_id="S").receive_messages()
    assert next_one.message_id == "a2"  # the session goes on with its next message
    dlq = bus.client().get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages()
    assert (dead.message_id, dead.dead_letter_reason) == ("a1", "MaxDeliveryCountExceeded")
    with pytest.raises(sb_errors.ServiceBusError):
        dlq.dead_letter_message(dead, reason="again")


def test_scheduled_messages_and_duplicates(bus: FakeServiceBus) -> None:
    sender = bus.client().get_queue_sender("q")
    when = bus.now() + timedelta(seconds=10)
    [seq] = sender.schedule_messages(ServiceBusMessage(b"x", message_id="s1", session_id="S"), when)
    sender.schedule_messages(ServiceBusMessage(b"x", message_id="s2", session_id="S"), when)
    sender.cancel_scheduled_messages(seq)
    sender.send_messages(ServiceBusMessage(b"x", message_id="s2", session_id="S"))  # a duplicate
    props = bus.admin().get_queue_runtime_properties("q")
    assert (props.active_message_count, props.scheduled_message_count) == (0, 1)
    bus.clock.advance(10)  # type: ignore[attr-defined]
    [m] = bus.client().get_queue_receiver("q", session_id="S").receive_messages(5)
    assert m.message_id == "s2"


def test_a_non_session_receiver_on_a_session_queue_is_refused(bus: FakeServiceBus) -> None:
    with pytest.raises(sb_errors.ServiceBusError, match="requires sessions"):
        bus.client().get_queue_receiver("q").receive_messages()


def test_administration_defaults_shared_names_and_topics(bus: FakeServiceBus) -> None:
    from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

    admin = bus.admin()
    plain = admin.create_queue("plain")  # what the service gives a property left out
    assert (plain.requires_session, plain.requires_duplicate_detection) == (False, False)
    assert (plain.max_delivery_count, plain.lock_duration) == (10, timedelta(minutes=1))
    assert plain.duplicate_detection_history_time_window == timedelta(minutes=10)
    with pytest.raises(ResourceExistsError):  # queues and topics share the namespace's names
        admin.create_topic("plain")
    with pytest.raises(ResourceNotFoundError):
        admin.get_topic("events")
    admin.create_topic("events", requires_duplicate_detection=True)
    sender = bus.client().get_topic_sender("events")
    for _ in range(2):  # a repeat inside the window is accepted and dropped
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage(b"x", message_id="m1", session_id="S"))
        sender.send_messages(batch)
    assert [s.message_id for s in bus.topics["events"].accepted] == ["m1"]
    with pytest.raises(sb_errors.MessagingEntityNotFoundError):  # opening the link finds it
        bus.client().get_queue_sender("missing").create_message_batch()

"""The fake namespace as tests build it: ``FakeServiceBus`` (the broker, handing out clients),
``FakeServiceBusClient`` (senders and receivers) and ``clients``, the factory for
``sdk.use_clients``.

Why apart from ``broker``: the clients import the broker, so what builds them sits above both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from outbox.testing.servicebus_fake.admin import FakeAdministrationClient
from outbox.testing.servicebus_fake.broker import Broker
from outbox.testing.servicebus_fake.receiver import FakeReceiver
from outbox.testing.servicebus_fake.sender import FakeSender


class FakeServiceBus(Broker):
    """The namespace: queues, a clock, and the broker's rules. Thread-safe (one lock)."""

    def client(self) -> FakeServiceBusClient:
        return FakeServiceBusClient(self)

    def admin(self) -> FakeAdministrationClient:
        return FakeAdministrationClient(self)


class FakeServiceBusClient:
    """``ServiceBusClient``: builds senders and receivers on the fake namespace."""

    def __init__(self, bus: FakeServiceBus) -> None:
        self.bus = bus
        self.closed = False
        self.receivers: list[FakeReceiver] = []

    def get_queue_sender(self, queue_name: str, **_: Any) -> FakeSender:
        return FakeSender(self.bus, queue_name)

    def get_topic_sender(self, topic_name: str, **_: Any) -> FakeSender:
        return FakeSender(self.bus, topic_name)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> FakeReceiver:
        receiver = FakeReceiver(self.bus, queue_name, **kwargs)
        self.receivers.append(receiver)
        return receiver

    def close(self) -> None:
        self.closed = True


def clients(
    bus: FakeServiceBus,
) -> Callable[[], tuple[FakeServiceBusClient, FakeAdministrationClient]]:
    """A factory for ``sdk.use_clients``: every adapter built from settings talks to
    ``bus``."""
    return lambda: (bus.client(), bus.admin())

"""The fake ``ServiceBusSender`` for one queue or topic: batches (the SDK's real
``ServiceBusMessageBatch``), scheduled messages and their cancellation, and a failure hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch

from outbox.testing.servicebus_fake.broker import Broker
from outbox.testing.servicebus_fake.entities import LINK_MAX_BYTES


class FakeSender:
    """``ServiceBusSender`` for one queue or topic."""

    def __init__(self, bus: Broker, queue_name: str) -> None:
        self.bus = bus
        self.queue_name = queue_name  # the entity: a queue's or a topic's name
        self.closed = False
        self.fail_next: list[BaseException] = []  # test hook: raised by the next sends

    def _check(self) -> None:
        if self.closed:
            raise ValueError("The handler has already been shutdown.")
        if self.fail_next:
            raise self.fail_next.pop(0)

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        """The SDK's real batch (its size accounting); opening the link finds a missing entity."""
        self._check()
        with self.bus.lock:
            if self.queue_name not in self.bus.topics:
                self.bus.queue(self.queue_name)  # MessagingEntityNotFoundError when missing
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or LINK_MAX_BYTES)

    def send_messages(
        self,
        message: ServiceBusMessage | ServiceBusMessageBatch | Sequence[ServiceBusMessage],
        *,
        timeout: float | None = None,
    ) -> None:
        self._check()
        if isinstance(message, ServiceBusMessageBatch):
            batch = list(message._messages)  # where the real batch keeps its messages
        elif isinstance(message, ServiceBusMessage):
            batch = [message]
        else:
            batch = list(message)
        self.bus.accept(self.queue_name, batch, None)

    def schedule_messages(
        self, messages: ServiceBusMessage | Sequence[ServiceBusMessage], schedule_time_utc: datetime
    ) -> list[int]:
        self._check()
        batch = [messages] if isinstance(messages, ServiceBusMessage) else list(messages)
        return self.bus.accept(self.queue_name, batch, schedule_time_utc)

    def cancel_scheduled_messages(self, sequence_numbers: int | Sequence[int]) -> None:
        self._check()
        seqs = {sequence_numbers} if isinstance(sequence_numbers, int) else set(sequence_numbers)
        with self.bus.lock:
            q = self.bus.queue(self.queue_name)
            q.active = [s for s in q.active if s.seq not in seqs]

    def close(self) -> None:
        self.closed = True

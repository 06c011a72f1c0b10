"""The fake ``ServiceBusAdministrationClient``: queues and topics read and created (with the
service's defaults for what is left out), and the runtime properties. It records what it created,
and what it was asked to change, which the outbox never does.
"""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from outbox.testing.servicebus_fake.broker import Broker
from outbox.testing.servicebus_fake.entities import (
    SERVICE_QUEUE_DEFAULTS,
    QueueSpec,
    RuntimeProperties,
    TopicSpec,
)


class FakeAdministrationClient:
    """``ServiceBusAdministrationClient``: queues and their runtime properties."""

    def __init__(self, bus: Broker) -> None:
        self.bus = bus
        self.created: list[str] = []
        self.updated: list[str] = []  # must stay empty: the outbox never changes an entity

    def get_queue(self, queue_name: str, **_: Any) -> QueueSpec:
        with self.bus.lock:
            q = self.bus.queues.get(queue_name)
            if q is None:
                raise ResourceNotFoundError(f"Entity '{queue_name}' was not found.")
            return q.spec

    def create_queue(self, queue_name: str, **props: Any) -> QueueSpec:
        given = {k: v for k, v in props.items() if k in SERVICE_QUEUE_DEFAULTS and v is not None}
        spec = self.bus.create_queue(queue_name, **{**SERVICE_QUEUE_DEFAULTS, **given})
        self.created.append(queue_name)
        return spec

    def get_topic(self, topic_name: str, **_: Any) -> TopicSpec:
        with self.bus.lock:
            t = self.bus.topics.get(topic_name)
            if t is None:
                raise ResourceNotFoundError(f"Topic '{topic_name}' does not exist")
            return t.spec

    def create_topic(self, topic_name: str, **props: Any) -> TopicSpec:
        known = set(TopicSpec.__dataclass_fields__) - {"name"}
        spec = self.bus.create_topic(
            topic_name, **{k: v for k, v in props.items() if k in known and v is not None}
        )
        self.created.append(topic_name)
        return spec

    def update_topic(self, topic: Any, **_: Any) -> None:
        self.updated.append(getattr(topic, "name", str(topic)))

    def update_queue(self, queue: Any, **_: Any) -> None:
        self.updated.append(getattr(queue, "name", str(queue)))

    def get_queue_runtime_properties(self, queue_name: str, **_: Any) -> RuntimeProperties:
        return self.bus.runtime_properties(queue_name)

    def close(self) -> None:
        pass

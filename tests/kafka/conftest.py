"""The Kafka tests' broker: a real Apache Kafka 4.4 (KRaft, one node) on 127.0.0.1, started
once per test worker from the JARs ``scripts/fetch-kafka.sh`` fetched. Missing JARs, Java or
confluent-kafka fail under ``CI=true`` and skip elsewhere."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from outbox.testing.kafka import KafkaBroker
from tests.local_server import unavailable

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # under CI the test modules' own imports fail loudly instead
    if not os.environ.get("CI"):
        collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    broker = KafkaBroker()
    if not broker.available:
        unavailable("the Kafka broker's JARs or Java are missing; run scripts/fetch-kafka.sh")
    broker.start()
    try:
        yield broker
    finally:
        broker.cleanup()


@pytest.fixture
def topic(kafka: KafkaBroker) -> str:
    """A fresh topic with 4 partitions."""
    return kafka.create_topic(f"t-{uuid.uuid4().hex[:12]}")

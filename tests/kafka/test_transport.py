"""The Kafka transport against a real broker: the shipped Transport contract, the fields as
headers, per-key partition order, and each refusal named with the message."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka.admin import NewTopic

from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.mapping import record_of
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    PermanentTransportError,
    RetryableTransportError,
    TransportUnavailableError,
)
from outbox.testing.contracts.transport import DEST, TransportContract
from testkit.kafka import PASSWORD, USER, KafkaBroker, end_offsets, read_records


class TestKafkaTransportContract(TransportContract):
    # Refusals are found before anything is produced, but a broker failing midway may leave a
    # prefix out: not all-or-nothing.
    atomic = False

    @pytest.fixture(autouse=True)
    def _broker(self, kafka: KafkaBroker) -> Iterator[None]:
        self.kafka = kafka
        admin = kafka.admin()
        # once; operation_timeout: the answer waits for the partitions' leaders
        admin.create_topics([NewTopic(DEST, 4, 1)], operation_timeout=30)[DEST].exception(60)
        self.since = end_offsets(kafka.bootstrap, DEST)  # earlier tests' records are not ours
        self.transports: list[KafkaTransport] = []
        yield
        for t in self.transports:
            t.close()

    def make_transport(self) -> Transport:
        t = KafkaTransport(KafkaConfig(self.kafka.bootstrap, send_timeout=30))
        self.transports.append(t)
        return t

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        return [record_of(m) for m in read_records(self.kafka.bootstrap, destination, self.since)]


def _msg(i: int, topic: str, key: str = "k", **kw: object) -> TransportMessage:
    fields: dict[str, object] = {
        "message_id": f"m{i}",
        "destination": topic,
        "body": b"{}",
        "session_id": key,
    }
    fields.update(kw)
    return TransportMessage(**fields)  # type: ignore[arg-type]


def test_the_key_is_the_kafka_key_so_a_key_keeps_one_partition_in_order(
    kafka: KafkaBroker, topic: str
) -> None:
    t = KafkaTransport(kafka.bootstrap)
    batch = [_msg(i, topic, key=f"key-{i % 7}") for i in range(70)]
    t.send(batch)
    t.close()
    records = read_records(kafka.bootstrap, topic)
    partitions: dict[bytes, set[int]] = {}
    for r in records:
        partitions.setdefault(r.key(), set()).add(r.partition())
    assert all(len(p) == 1 for p in partitions.values()), "one partition per key"
    assert len({p for ps in partitions.values() for p in ps}) > 1, "keys spread over partitions"
    for k in range(7):
        ids = [record_of(r).message_id for r in records if r.key() == f"key-{k}".encode()]
        assert ids == [f"m{i}" for i in range(70) if i % 7 == k]


def test_the_fields_travel_as_headers_and_traceparent_as_it_is(
    kafka: KafkaBroker, topic: str
) -> None:
    t = KafkaTransport(kafka.bootstrap)
    t.send(
        [
            _msg(
                1,
                topic,
                subject="ShipmentStatusChanged",
                correlation_id="c-1",
                headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            )
        ]
    )
    t.close()
    [r] = read_records(kafka.bootstrap, topic)
    assert dict(r.headers()) == {
        "outbox-message-id": b"m1",
        "outbox-subject": b"ShipmentStatusChanged",
        "content-type": b"application/json",
        "outbox-correlation-id": b"c-1",
        "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    assert r.key() == b"k"
    assert r.value() == b"{}"


def test_refusals_name_the_message_and_produce_nothing_of_the_batch(
    kafka: KafkaBroker, topic: str
) -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    t = KafkaTransport(kafka.bootstrap, clock=clock)
    ok = _msg(1, topic)
    cases = [
        (_msg(2, "no-such-topic"), "has no topic 'no-such-topic'"),
        (_msg(3, "a b"), "is not a Kafka topic name"),
        (_msg(4, topic, scheduled_at=clock.now() + timedelta(minutes=1)), "no scheduled"),
        (_msg(5, topic, headers={"outbox-message-id": "x"}), "reserved"),
    ]
    for bad, why in cases:
        with pytest.raises(PermanentTransportError, match=why) as err:
            t.send([ok, bad])
        assert err.value.message_id == bad.message_id
    t.close()
    assert read_records(kafka.bootstrap, topic) == []


def test_a_message_over_the_topics_size_limit_is_refused_permanently(
    kafka: KafkaBroker,
) -> None:
    small = kafka.create_topic("t-small-limit", 1, {"max.message.bytes": "20000"})
    t = KafkaTransport(kafka.bootstrap)
    with pytest.raises(PermanentTransportError, match="Message size too large") as err:
        t.send([_msg(1, small, body=b"x" * 30_000)])
    assert err.value.message_id == "m1"
    assert "max.message.bytes" in (err.value.hint or "")
    t.close()


def test_a_failed_login_fails_the_send_retryably_at_once(kafka: KafkaBroker, topic: str) -> None:
    bad = KafkaConfig(
        kafka.sasl_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_username=USER,
        sasl_password="wrong",
        send_timeout=60,
    )
    t = KafkaTransport(bad)
    with pytest.raises(RetryableTransportError, match="did not accept the login") as err:
        t.send([_msg(1, topic)])
    assert "kafka_sasl_password" in (err.value.hint or "")
    good = KafkaTransport(
        KafkaConfig(
            kafka.sasl_bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_username=USER,
            sasl_password=PASSWORD,
        )
    )
    good.send([_msg(2, topic)])
    good.close()
    assert [record_of(r).message_id for r in read_records(kafka.bootstrap, topic)] == ["m2"]


def test_an_unreachable_broker_fails_the_send_retryably_within_the_send_timeout() -> None:
    t = KafkaTransport(KafkaConfig("127.0.0.1:1", send_timeout=1))
    with pytest.raises(RetryableTransportError, match="could not reach Kafka") as err:
        t.send([_msg(1, "anything")])
    assert err.value.message_id == "m1"
    assert "stay pending" in (err.value.hint or "")
    # the brokers, not the message: a dispatch sends nothing more there (one timeout, not one
    # per document; docs/dispatcher.md)
    assert isinstance(err.value, TransportUnavailableError)

"""``MqttTransport`` against a real mosquitto: the shipped Transport contract suite, the field
mapping, and how a broker outage, a refused message and bad settings surface."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.mqtt.client import MqttBroker, MqttConnection
from dispatcher.mqtt.transport import MqttTransport, from_mqtt
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.clock import ManualClock
from outbox.core.errors import (
    ConfigurationError,
    PermanentTransportError,
    RetryableTransportError,
)
from outbox.testing.contracts.transport import DEST, TransportContract
from tests.mqtt.broker import MosquittoServer
from tests.mqtt.recorder import Recorder


class TestMqttTransportContract(TransportContract):
    # Refusals are found before anything is published, but a broker failing midway may leave
    # a prefix out: not all-or-nothing.
    atomic = False

    @pytest.fixture(autouse=True)
    def _broker(self, mqtt_url: str) -> Iterator[None]:
        self.url = mqtt_url
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.recorder = Recorder(mqtt_url, f"{self.prefix}/#")
        self.transports: list[MqttTransport] = []
        yield
        for t in self.transports:
            t.close()
        self.recorder.close()

    def make_transport(self) -> Transport:
        t = MqttTransport(self.url, topic=f"{self.prefix}/{{destination}}")
        self.recorder.fence(t.connection, f"{self.prefix}/{DEST}")  # subscribed before sends
        self.transports.append(t)
        return t

    def delivered(self, transport: Transport, destination: str = DEST) -> list[TransportMessage]:
        conn = self.transports[0] if not isinstance(transport, MqttTransport) else transport
        self.recorder.fence(conn.connection, f"{self.prefix}/{destination}")
        return [
            from_mqtt(m, destination)
            for m in self.recorder.messages
            if m.topic == f"{self.prefix}/{destination}"
        ]

    def test_refused_message_publishes_nothing_of_the_batch(self) -> None:
        t = self.make_transport()
        ok = TransportMessage(message_id="a", destination=DEST, body=b"1")
        bad = TransportMessage(message_id="b", destination="a b", body=b"2")
        with pytest.raises(PermanentTransportError, match="message b"):
            t.send([ok, bad])
        assert self.delivered(t) == []


def test_fields_ride_as_mqtt5_properties_and_session_topics(mqtt_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    rec = Recorder(mqtt_url, f"{prefix}/#")
    t = MqttTransport(mqtt_url, topic=f"{prefix}/{{destination}}/{{session}}")
    try:
        m = TransportMessage(
            message_id="order-1:7",
            destination="devices",
            body=b'{"a":1}',
            subject="Open",
            content_type="application/cloudevents+json",
            session_id="door-7",
            correlation_id="corr-9",
            headers={"traceparent": "00-abc-def-01"},
        )
        rec.fence(t.connection, f"{prefix}/devices/door-7")
        t.send([m])
        rec.fence(t.connection, f"{prefix}/devices/door-7")
        (got,) = rec.messages
        assert got.topic == f"{prefix}/devices/door-7"
        assert got.qos == 1
        assert from_mqtt(got, "devices") == m
    finally:
        t.close()
        rec.close()


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"session_id": None}, "needs a session id"),
        ({"session_id": "a/b"}, "not one topic level"),
        ({"session_id": "a+"}, "not one topic level"),
        ({"headers": {"outbox-message-id": "x"}}, "reserved"),
        ({"scheduled_at": datetime(2030, 1, 1, tzinfo=UTC)}, "no scheduled delivery"),
    ],
)
def test_what_mqtt_cannot_carry_is_refused_permanently(
    mqtt_url: str, fields: dict[str, object], match: str
) -> None:
    t = MqttTransport(mqtt_url, topic="x/{session}", clock=ManualClock())
    try:
        m = TransportMessage(
            **{"message_id": "m1", "destination": "d", "body": b"1", "session_id": "s", **fields}  # type: ignore[arg-type]
        )
        with pytest.raises(PermanentTransportError, match=match) as err:
            t.send([m])
        assert err.value.message_id == "m1"
    finally:
        t.close()


def test_a_past_schedule_is_sent_at_once(mqtt_url: str) -> None:
    clock = ManualClock()
    t = MqttTransport(mqtt_url, clock=clock)
    try:
        when = clock.now() - timedelta(seconds=1)
        t.send([TransportMessage(message_id="m", destination="d", body=b"1", scheduled_at=when)])
    finally:
        t.close()


def test_broker_down_is_retryable_and_sending_resumes_after_restart(
    mosquitto: MosquittoServer | str,
) -> None:
    if isinstance(mosquitto, str):
        pytest.skip("restarts only the broker the tests started")
    own = MosquittoServer()  # a broker of its own: the session's stays up for the others
    own.start()
    try:
        t = MqttTransport(own.url, timeout=2)
        m = TransportMessage(message_id="m1", destination="d", body=b"1")
        t.send([m])
        own.stop()
        with pytest.raises(RetryableTransportError) as err:
            t.send([m])
        assert err.value.message_id == "m1"
        own.start()
        assert t.connection.wait_connected(10), "the connection comes back by itself"
        t.send([m])
        t.close()
    finally:
        own.cleanup()


def test_unreachable_broker_and_bad_urls_say_what_to_fix() -> None:
    with pytest.raises(ConfigurationError, match="mqtt://host:port"):
        MqttBroker.parse("http://example")
    closed = MosquittoServer()  # a free port nobody listens on
    with pytest.raises(RetryableTransportError, match="did not accept a connection"):
        MqttConnection(MqttBroker.parse(f"mqtt://127.0.0.1:{closed.port}"), connect_timeout=0.5)
    closed.cleanup()
    b = MqttBroker.parse("mqtts://u:p%40ss@broker.example")
    assert (b.host, b.port, b.tls, b.username, b.password) == (
        "broker.example",
        8883,
        True,
        "u",
        "p@ss",
    )
    assert "p@ss" not in repr(b)


def test_a_publish_the_broker_refuses_in_its_puback_is_permanent(
    mosquitto: MosquittoServer | str,
) -> None:
    """Settled means the PUBACK's reason code was read: mosquitto answers a publish its ACL denies
    with PUBACK 0x87 (not authorized), which paho alone would report as published."""
    if isinstance(mosquitto, str):
        pytest.skip("needs a broker of its own, with an ACL")
    own = MosquittoServer(("acl_file {dir}/acl",))
    (own.dir / "acl").write_text("topic readwrite allowed/#\n")
    own.start()
    t = MqttTransport(own.url, timeout=5)
    try:
        t.send([TransportMessage(message_id="ok", destination="allowed/x", body=b"1")])
        with pytest.raises(PermanentTransportError, match="refused it") as err:
            t.send([TransportMessage(message_id="no", destination="denied/x", body=b"1")])
        assert err.value.message_id == "no"
    finally:
        t.close()
        own.cleanup()


def test_a_publish_paho_never_sent_settles_as_retryable_not_as_a_crash() -> None:
    """The connection can drop between the connected check and paho's publish: paho then hands
    back an info whose ``is_published`` raises. The gateway's settling read that as a crash (a
    surviving gateway died with "The client is not currently connected" in a CI run); it is the
    broker's failure, given back to the line."""
    from paho.mqtt.client import MQTTMessageInfo
    from paho.mqtt.enums import MQTTErrorCode

    from dispatcher.mqtt.client import Publish

    closed = MosquittoServer()  # nobody listens: the connection never comes up
    conn = MqttConnection(MqttBroker.parse(f"mqtt://127.0.0.1:{closed.port}"), wait=False)
    try:
        item = Publish(topic="t/dev1/tasks", payload=b"{}", label="m1")
        for rc in (MQTTErrorCode.MQTT_ERR_NO_CONN, MQTTErrorCode.MQTT_ERR_QUEUE_SIZE):
            info = MQTTMessageInfo(7)
            info.rc = rc
            settled, error = conn.outcome(item, info)
            assert settled
            assert isinstance(error, RetryableTransportError)
            assert error.message_id == "m1"
        pending = MQTTMessageInfo(8)  # sent, its PUBACK not come: not settled, no error
        assert conn.outcome(item, pending) == (False, None)
    finally:
        conn.close()
        closed.cleanup()

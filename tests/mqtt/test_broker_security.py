"""The broker options that matter in production, against a real mosquitto: a username and
password (wrong ones are refused, with a message that says so), and TLS checked against a CA."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatcher.mqtt.client import MqttBroker
from dispatcher.mqtt.transport import MqttTransport
from dispatcher.transports.base import TransportMessage
from outbox.core.errors import RetryableTransportError
from tests.mqtt.broker import MosquittoServer


@pytest.fixture
def own_broker(mosquitto: MosquittoServer | str) -> MosquittoServer:
    if isinstance(mosquitto, str):
        pytest.skip("needs a broker of its own, configured by the test")
    return MosquittoServer()


def test_username_and_password(own_broker: MosquittoServer) -> None:
    passwords = own_broker.dir / "passwords"
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(passwords), "gateway", "s3cret"],
        check=True,
        capture_output=True,
    )
    own_broker.extra_config = ("allow_anonymous false", f"password_file {passwords}")
    own_broker.start()
    try:
        url = own_broker.url.replace("mqtt://", "mqtt://gateway:s3cret@")
        t = MqttTransport(url)
        t.send([TransportMessage(message_id="m1", destination="d", body=b"1")])
        t.close()
        with pytest.raises(RetryableTransportError, match="refused") as err:
            MqttTransport(MqttBroker.parse(own_broker.url, username="gateway", password="nope"))
        assert "nope" not in str(err.value)
    finally:
        own_broker.cleanup()


def test_tls_checked_against_a_ca(own_broker: MosquittoServer, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    own_broker.extra_config = (f"certfile {cert}", f"keyfile {key}")
    own_broker.start()
    try:
        url = f"mqtts://127.0.0.1:{own_broker.port}"
        t = MqttTransport(MqttBroker.parse(url, ca_file=str(cert)))
        t.send([TransportMessage(message_id="m1", destination="d", body=b"1")])
        t.close()
        with pytest.raises(RetryableTransportError, match="did not accept"):
            MqttTransport(MqttBroker.parse(url), connect_timeout=1)  # the system CAs do not know it
        with pytest.raises(RetryableTransportError, match="did not accept"):
            MqttTransport(
                MqttBroker.parse(own_broker.url), connect_timeout=1
            )  # plain MQTT to a TLS port
    finally:
        own_broker.cleanup()

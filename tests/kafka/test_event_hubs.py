"""Event Hubs through its Kafka endpoint: the connection-string settings (offline), and a live
send and read that runs when ``OUTBOX_TEST_EVENTHUBS_CONNECTION_STRING`` and
``OUTBOX_TEST_EVENTHUBS_HUB`` are set (it says so when it is skipped)."""

from __future__ import annotations

import os
import uuid

import pytest

from dispatcher.kafka.config import EVENT_HUBS_USERNAME, KafkaConfig
from dispatcher.kafka.mapping import record_of
from dispatcher.kafka.reading import end_offsets, read_records
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.transports.base import TransportMessage
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings

CONN = (
    "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=send;"
    "SharedAccessKey=c2VjcmV0LWtleQ=="
)


def test_a_connection_string_sets_the_servers_and_sasl_ssl_plain(tmp_path: object) -> None:
    config = KafkaConfig.from_settings(Settings(kafka_connection_string=CONN))
    conf = config.producer()
    assert conf["bootstrap.servers"] == "contoso.servicebus.windows.net:9093"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "PLAIN"
    assert conf["sasl.username"] == EVENT_HUBS_USERNAME == "$ConnectionString"
    assert conf["sasl.password"] == CONN
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert "c2VjcmV0" not in repr(config) + config.describe()
    assert Settings(kafka_connection_string=CONN).to_dict()["kafka_connection_string"] == "***"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("Endpoint=https://x/y/;SharedAccessKey=k", "not an Event Hubs connection string"),
        ("SharedAccessKeyName=a;SharedAccessKey=k", "not an Event Hubs connection string"),
        ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=a", "no SharedAccessKey"),
    ],
)
def test_a_malformed_connection_string_is_named_without_echoing_it(value: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why) as err:
        KafkaConfig.from_settings(Settings(kafka_connection_string=value))
    assert value not in str(err.value)


def test_without_servers_or_a_connection_string_the_setting_is_named() -> None:
    with pytest.raises(ConfigurationError, match="'kafka_bootstrap_servers' is missing"):
        KafkaConfig.from_settings(Settings(transport="kafka"))


@pytest.mark.live
def test_live_event_hubs_send_and_read() -> None:
    conn = os.environ.get("OUTBOX_TEST_EVENTHUBS_CONNECTION_STRING", "")
    hub = os.environ.get("OUTBOX_TEST_EVENTHUBS_HUB", "")
    if not conn or not hub:
        pytest.skip(
            "live Event Hubs test skipped: set OUTBOX_TEST_EVENTHUBS_CONNECTION_STRING and "
            "OUTBOX_TEST_EVENTHUBS_HUB (an existing event hub) to run it"
        )
    config = KafkaConfig.from_settings(Settings(kafka_connection_string=conn))
    since = end_offsets(config, hub)
    mid = f"live-{uuid.uuid4().hex}"
    t = KafkaTransport(config)
    t.send([TransportMessage(message_id=mid, destination=hub, body=b"{}", session_id="k")])
    t.close()
    got = [record_of(r).message_id for r in read_records(config, hub, since)]
    assert mid in got

"""The shipped backends' options: ``[cosmos]``, ``[kafka]``, ``[servicebus]`` and ``[mqtt]``.

They live in the kernel, not beside their adapters in ``dispatcher``, because ``Settings`` keeps
their flat names (``settings.kafka_bootstrap_servers``) as views for the code written before
sections, and the kernel imports nothing above it. ``outbox.wiring.builtin`` names each one on
the backends that read it, as a third party's ``Backend`` names its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from outbox.core.settings_sections import BackendOptions
from outbox.core.settings_values import setting

#: ``servicebus_destinations`` entries with this prefix are topics; the others are queues.
TOPIC_PREFIX = "topic:"
ENTITY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True, slots=True)
class CosmosOptions(BackendOptions):
    """Cosmos DB for rescuer checkpoints, consumer inboxes and the geo claim log
    ([cosmos.md](cosmos.md)): used when `checkpoint_store`, `inbox_store` or `claim_log` is
    `cosmos`; `outbox migrate` creates the database and the containers."""

    SECTION = "cosmos"
    FLAT = True

    endpoint: str = setting(
        "",
        "the account's `https://` URL, e.g. `https://ACCOUNT.documents.azure.com:443/`; when set, "
        "`outbox migrate` provisions the database and the containers",
    )
    key: str = setting(
        "",
        "the account key; empty: sign in with `DefaultAzureCredential` (needs azure-identity); "
        "best in `OUTBOX_COSMOS_KEY`, never printed",
        secret=True,
    )
    database: str = setting("outbox", "the database")
    checkpoint_container: str = setting("checkpoints", "the rescuer checkpoints' container")
    inbox_container: str = setting("inbox", "the consumer inboxes' container (`CosmosInbox`)")
    claims_container: str = setting("claims", "the geo claim log's container ([geo.md](geo.md))")

    def validate(self, settings: Any) -> None:
        if self.endpoint and not self.endpoint.startswith(("https://", "http://")):
            raise self.invalid("endpoint", f"{self.endpoint!r} is not an https:// URL")
        for key in ("database", "checkpoint_container", "inbox_container", "claims_container"):
            if not getattr(self, key):
                raise self.invalid(key, "must not be empty")


@dataclass(frozen=True, slots=True)
class KafkaOptions(BackendOptions):
    """Apache Kafka or Azure Event Hubs as the transport (`transport = "kafka"`,
    [kafka.md](kafka.md))."""

    SECTION = "kafka"
    FLAT = True

    bootstrap_servers: str = setting("", "the brokers, `host:9092,host2:9092`")
    connection_string: str = setting(
        "",
        "an Event Hubs connection string instead (it sets the servers, `SASL_SSL` and `PLAIN`); "
        "never printed",
        secret=True,
    )
    security_protocol: str = setting(
        "",
        "`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`",
        shown="`PLAINTEXT` (`SASL_SSL` with a connection string)",
    )
    sasl_mechanism: str = setting("PLAIN", "the SASL mechanism, e.g. `SCRAM-SHA-512`")
    sasl_username: str = setting("", "the SASL user")
    sasl_password: str = setting("", "the SASL password; never printed", secret=True)
    send_timeout: float = setting(
        30.0,
        "how long one send may wait for the brokers' acknowledgements before it fails retryably "
        "(librdkafka's `message.timeout.ms`); at most `10m`",
    )
    partitions: int = setting(
        0,
        "partitions of the topics `outbox migrate` creates (`0`: the broker's `num.partitions`)",
    )
    options: dict[str, str] = setting(  # noqa: RUF009 (a dataclasses.field)
        {},
        'more librdkafka properties, e.g. `{ "ssl.ca.location" = "/etc/ssl/certs/ca.pem" }` '
        "(env: `key=value,key=value`); they win over the outbox's own; values never printed",
        secret=True,
    )

    def validate(self, settings: Any) -> None:
        protocol = self.security_protocol
        if protocol and protocol.upper() not in _PROTOCOLS:
            raise self.invalid(
                "security_protocol", f"{protocol!r}; use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            )
        if not 0 < self.send_timeout <= 600:
            raise self.invalid("send_timeout", f"{self.send_timeout:g}s; must be in (0s, 10m]")
        if not isinstance(self.partitions, int) or self.partitions < 0:
            raise self.invalid("partitions", "must be 0 (the broker's default) or more")


@dataclass(frozen=True, slots=True)
class ServiceBusOptions(BackendOptions):
    """Azure Service Bus as the transport or the command queue ([servicebus.md](servicebus.md)).
    The connection is never in a file: `OUTBOX_SERVICEBUS_CONNECTION_STRING`, or
    `OUTBOX_SERVICEBUS_NAMESPACE` with azure-identity; `OUTBOX_SERVICEBUS_TOPICS` lists the
    destinations that are topics."""

    SECTION = "servicebus"
    FLAT = True

    destinations: tuple[str, ...] = setting(
        (),
        "the queues (and `topic:NAME` topics) `outbox migrate` creates; they count as declared "
        "`destinations`; env: comma-separated",
    )

    def validate(self, settings: Any) -> None:
        """Each entry is ``NAME`` (a queue) or ``topic:NAME``; NAME as Service Bus spells entity
        paths. Checked here so a typo fails at load, not half-way through ``outbox migrate``."""
        seen: set[str] = set()
        for entry in self.destinations:
            name = entry.removeprefix(TOPIC_PREFIX)
            if not ENTITY_NAME.match(name) or len(name) > 260:
                raise self.invalid(
                    "destinations",
                    f"{entry!r} is not a queue name or topic:NAME; names are 1-260 letters, "
                    "digits, '.', '-', '_' or '/', starting with a letter or digit",
                )
            if name in seen:
                raise self.invalid("destinations", f"{name!r} is listed twice")
            if name == settings.command_queue:
                raise self.invalid(
                    "destinations",
                    f"{name!r} is the command_queue, which outbox migrate creates on its own",
                )
            seen.add(name)


@dataclass(frozen=True, slots=True)
class MqttOptions(BackendOptions):
    """MQTT as the transport (`transport = "mqtt"`): QoS 1, a message settled on its PUBACK."""

    SECTION = "mqtt"
    FLAT = True

    broker: str = setting(
        "",
        "`mqtt://[user:password@]host:port` (`mqtts://` for TLS); best in `OUTBOX_MQTT_BROKER`, "
        "never printed",
        secret=True,
    )
    topic: str = setting(
        "{destination}", "the topic template (`{destination}`, and `{session}` per device)"
    )


#: In the order their settings are validated and documented.
SHIPPED: tuple[type[BackendOptions], ...] = (
    CosmosOptions,
    KafkaOptions,
    ServiceBusOptions,
    MqttOptions,
)

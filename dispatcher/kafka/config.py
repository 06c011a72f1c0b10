"""librdkafka properties from the settings, for the producer, the consumer and the admin client.

Why one place: the transport, the consumer helper, ``outbox migrate`` and the Spark executors
must all reach the same cluster the same way, and an Event Hubs connection string has to be
turned into bootstrap servers and SASL properties once, not per caller. Secrets stay out of
error messages: ``describe`` names the servers and the protocol only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox.core.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

#: The Kafka endpoint of an Event Hubs namespace listens here (TLS only).
EVENT_HUBS_PORT = 9093
#: Event Hubs' documented username for connection-string authentication.
EVENT_HUBS_USERNAME = "$ConnectionString"


def load_client() -> Any:
    """The ``confluent_kafka`` module, or ``MissingDependencyError`` with the extra to install."""
    try:
        import confluent_kafka
    except ImportError as e:
        raise MissingDependencyError(
            "the Kafka transport needs confluent-kafka",
            hint="pip install 'delta-outbox[kafka]'",
        ) from e
    return confluent_kafka


def parse_event_hubs(connection_string: str) -> str:
    """The namespace host of an Event Hubs connection string
    (``Endpoint=sb://NS.servicebus.windows.net/;SharedAccessKeyName=...;SharedAccessKey=...``).

    The error never echoes the string: it holds a key."""
    parts: dict[str, str] = {}
    for item in connection_string.strip().split(";"):
        if "=" in item:
            key, _, value = item.partition("=")
            parts[key.strip().lower()] = value.strip()
    endpoint = parts.get("endpoint", "")
    host = endpoint.removeprefix("sb://").removeprefix("https://").rstrip("/")
    if not endpoint.startswith(("sb://", "https://")) or not host or "/" in host:
        raise ConfigurationError(
            "setting 'kafka_connection_string' is not an Event Hubs connection string "
            "(no Endpoint=sb://NAMESPACE.servicebus.windows.net/)",
            hint="copy it from the namespace's Shared access policies in the Azure portal",
        )
    if "sharedaccesskey" not in parts and "sharedaccesssignature" not in parts:
        raise ConfigurationError(
            "setting 'kafka_connection_string' has no SharedAccessKey or SharedAccessSignature",
            hint="copy the whole connection string of a shared access policy",
        )
    return host if ":" in host else f"{host}:{EVENT_HUBS_PORT}"


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach one Kafka cluster (or Event Hubs namespace)."""

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    send_timeout: float = 30.0
    partitions: int = 0
    options: Mapping[str, str] = field(default_factory=dict, repr=False)
    event_hubs: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaConfig:
        conn = settings.kafka_connection_string.strip()
        if conn:
            return cls(
                bootstrap_servers=parse_event_hubs(conn),
                security_protocol=(settings.kafka_security_protocol or "SASL_SSL").upper(),
                sasl_mechanism="PLAIN",
                sasl_username=EVENT_HUBS_USERNAME,
                sasl_password=conn,
                send_timeout=settings.kafka_send_timeout,
                partitions=settings.kafka_partitions,
                options=dict(settings.kafka_options),
                event_hubs=True,
            )
        if not settings.kafka_bootstrap_servers.strip():
            raise ConfigurationError(
                "setting 'kafka_bootstrap_servers' is missing: transport 'kafka' needs the "
                "brokers (or 'kafka_connection_string' for Event Hubs)",
                hint="set OUTBOX_KAFKA_BOOTSTRAP_SERVERS=host:9092 (or "
                "OUTBOX_KAFKA_CONNECTION_STRING to an Event Hubs connection string)",
            )
        return cls(
            bootstrap_servers=settings.kafka_bootstrap_servers.strip(),
            security_protocol=(settings.kafka_security_protocol or "PLAINTEXT").upper(),
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password,
            send_timeout=settings.kafka_send_timeout,
            partitions=settings.kafka_partitions,
            options=dict(settings.kafka_options),
        )

    def describe(self) -> str:
        """Where, without secrets: for log lines and errors."""
        return f"{self.bootstrap_servers} ({self.security_protocol})"

    def common(self) -> dict[str, Any]:
        """Properties every client of this cluster takes."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            # librdkafka logs through stderr by default; the clients' error callbacks report
            # instead, as one line through the logging module.
            "log_level": 0,
        }
        if self.security_protocol.startswith("SASL"):
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = self.sasl_password
        if self.event_hubs:  # Event Hubs closes idle connections after 240 s (its Kafka guide)
            conf["socket.keepalive.enable"] = True
            conf["metadata.max.age.ms"] = 180_000
        conf.update(self.options)
        return conf

    def producer(self) -> dict[str, Any]:
        """An idempotent producer: ``acks=all``, per-partition order kept across retries."""
        conf = self.common()
        conf.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                # Every message gets a delivery report by this time: the send's bound.
                "message.timeout.ms": int(self.send_timeout * 1000),
            }
        )
        conf.update(self.options)  # an explicit option wins
        return conf

    def consumer(self, group: str) -> dict[str, Any]:
        """A group member that commits offsets itself, after the handler."""
        conf = self.common()
        conf.update(
            {
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "allow.auto.create.topics": False,
            }
        )
        conf.update(self.options)
        return conf

"""The shipped backends' settings under the flat names they had before sections
(``settings.kafka_bootstrap_servers``), as read-only views of the sections: code written against
them, in this repository and in users' programs, keeps working unchanged. New code reads
``settings.options(KafkaOptions).bootstrap_servers``; tests/test_settings_sections.py checks that
every key of a ``FLAT`` section has its view here.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, overload

from outbox.core.settings_backends import (
    CosmosOptions,
    KafkaOptions,
    MqttOptions,
    ServiceBusOptions,
)
from outbox.core.settings_sections import BackendOptions

T = TypeVar("T")


class _Flat(Generic[T]):
    """``settings.<section>_<key>``: the key of the settings' section, read-only."""

    def __init__(self, options: type[BackendOptions], key: str) -> None:
        self.options = options
        self.key = key

    @overload
    def __get__(self, obj: None, owner: Any) -> _Flat[T]: ...

    @overload
    def __get__(self, obj: object, owner: Any) -> T: ...

    def __get__(self, obj: object | None, owner: Any) -> _Flat[T] | T:
        if obj is None:
            return self
        value: T = getattr(cast(Any, obj).options(self.options), self.key)
        return value


class FlatNames:
    """The views, one per key of the shipped sections."""

    __slots__ = ()

    cosmos_endpoint = _Flat[str](CosmosOptions, "endpoint")
    cosmos_key = _Flat[str](CosmosOptions, "key")
    cosmos_database = _Flat[str](CosmosOptions, "database")
    cosmos_checkpoint_container = _Flat[str](CosmosOptions, "checkpoint_container")
    cosmos_inbox_container = _Flat[str](CosmosOptions, "inbox_container")
    cosmos_claims_container = _Flat[str](CosmosOptions, "claims_container")
    kafka_bootstrap_servers = _Flat[str](KafkaOptions, "bootstrap_servers")
    kafka_connection_string = _Flat[str](KafkaOptions, "connection_string")
    kafka_security_protocol = _Flat[str](KafkaOptions, "security_protocol")
    kafka_sasl_mechanism = _Flat[str](KafkaOptions, "sasl_mechanism")
    kafka_sasl_username = _Flat[str](KafkaOptions, "sasl_username")
    kafka_sasl_password = _Flat[str](KafkaOptions, "sasl_password")
    kafka_send_timeout = _Flat[float](KafkaOptions, "send_timeout")
    kafka_partitions = _Flat[int](KafkaOptions, "partitions")
    kafka_options = _Flat[dict[str, str]](KafkaOptions, "options")
    servicebus_destinations = _Flat[tuple[str, ...]](ServiceBusOptions, "destinations")
    mqtt_broker = _Flat[str](MqttOptions, "broker")
    mqtt_topic = _Flat[str](MqttOptions, "topic")

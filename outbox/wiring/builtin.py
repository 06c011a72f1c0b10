"""The shipped backends, registered by name: the only place that knows which class a setting's
value means.

Each builder takes the process's ``Backends`` (a ``Context``: settings, clock, shared queues) and
imports its module when called, so naming a backend whose optional extra is missing fails only
when it is used, with the extra to install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from migrations.runner import Provisioned, Provisioner
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings
from outbox.core.settings_backends import (
    CosmosOptions,
    KafkaOptions,
    MqttOptions,
    ServiceBusOptions,
)
from outbox.wiring.registry import Backend, Context, Registry

if TYPE_CHECKING:
    from dispatcher.claims.ports import ClaimLog
    from dispatcher.queue.command_queue import CommandQueue
    from dispatcher.queue.inbox import Inbox
    from dispatcher.transports.base import Transport
    from rescuer.checkpoint import ClosableCheckpointStore
    from rescuer.planner import Engine

    TransportBuilder = Callable[[Context], Transport]
    CommandQueueBuilder = Callable[[Context], CommandQueue]
    CheckpointStoreBuilder = Callable[[Context], ClosableCheckpointStore]
    EngineBuilder = Callable[[Context], Engine]
    ClaimLogBuilder = Callable[[Context], ClaimLog]
    InboxBuilder = Callable[[Context, str], Inbox]

TRANSPORTS: Registry[TransportBuilder] = Registry(
    "transport", "transport", "delta_outbox.transports"
)
COMMAND_QUEUES: Registry[CommandQueueBuilder] = Registry(
    "command queue", "command_transport", "delta_outbox.command_queues"
)
CHECKPOINT_STORES: Registry[CheckpointStoreBuilder] = Registry(
    "checkpoint store", "checkpoint_store", "delta_outbox.checkpoint_stores"
)
RESCUER_ENGINES: Registry[EngineBuilder] = Registry(
    "rescuer engine", "rescuer_engine", "delta_outbox.rescuer_engines"
)
CLAIM_LOGS: Registry[ClaimLogBuilder] = Registry(
    "claim log", "claim_log", "delta_outbox.claim_logs"
)
INBOXES: Registry[InboxBuilder] = Registry("inbox", "inbox_store", "delta_outbox.inboxes")

#: Every kind chosen by a setting, in the order ``check`` reports them.
REGISTRIES: tuple[Registry[Any], ...] = (
    TRANSPORTS,
    COMMAND_QUEUES,
    CHECKPOINT_STORES,
    RESCUER_ENGINES,
    CLAIM_LOGS,
    INBOXES,
)


def _needs_cosmos(setting: str) -> Callable[[Settings], None]:
    def check(settings: Settings) -> None:
        if not settings.options(CosmosOptions).endpoint:
            raise ConfigurationError(
                f"setting 'cosmos_endpoint' is missing: {setting} is cosmos but no endpoint is set",
                hint="set OUTBOX_COSMOS_ENDPOINT, e.g. https://ACCOUNT.documents.azure.com:443/",
            )

    return check


def _needs_mqtt_broker(settings: Settings) -> None:
    if not settings.options(MqttOptions).broker:
        raise ConfigurationError(
            "setting 'mqtt_broker' is missing: transport 'mqtt' needs the broker's URL",
            hint="set OUTBOX_MQTT_BROKER=mqtt://host:1883 (mqtts:// for TLS)",
        )


def _needs_kafka(settings: Settings) -> None:
    from dispatcher.kafka.config import KafkaConfig

    KafkaConfig.from_settings(settings)  # the servers, or a valid Event Hubs connection string


def _kafka_topics(settings: Settings) -> Provisioned:
    from dispatcher.kafka.admin import provision_topics

    return provision_topics(settings)


def _servicebus_destinations(settings: Settings) -> Provisioned:
    from dispatcher.servicebus.admin import provision_destinations

    return provision_destinations(settings)


def _servicebus_command_queue(settings: Settings) -> Provisioned:
    from dispatcher.servicebus.admin import provision_commands

    return provision_commands(settings)


# --- transports --------------------------------------------------------------------------------


def _sql_transport(b: Context) -> Transport:
    from dispatcher.transports.sql import ReachableSqlTransport

    return ReachableSqlTransport(lambda: b.sql_queue)


def _memory_transport(b: Context) -> Transport:
    from dispatcher.transports.memory import InMemoryTransport

    return InMemoryTransport()


def _servicebus_transport(b: Context) -> Transport:
    from dispatcher.servicebus.transport import ServiceBusTransport

    return ServiceBusTransport.from_settings(b.settings)


def _mqtt_transport(b: Context) -> Transport:
    from dispatcher.mqtt.transport import MqttTransport

    mqtt = b.settings.options(MqttOptions)
    return MqttTransport(mqtt.broker, topic=mqtt.topic, wait_for_broker=False)


def _server_database(settings: Settings) -> bool:
    """The SQL queue on a server database takes many writers; SQLite's one writer would only
    queue Spark's executors."""
    return not settings.sql_url.startswith("sqlite")


def _always(_settings: Settings) -> bool:
    return True


TRANSPORTS.add(
    Backend(
        "sql",
        _sql_transport,
        description="the embedded SQL queue",
        on_executors=_server_database,
    )
)
TRANSPORTS.add(Backend("memory", _memory_transport, description="in memory, for tests and docs"))
TRANSPORTS.add(
    Backend(
        "servicebus",
        _servicebus_transport,
        extra="azure",
        provision=(_servicebus_destinations,),
        on_executors=_always,
        options=ServiceBusOptions,
    )
)
TRANSPORTS.add(
    Backend("mqtt", _mqtt_transport, check=_needs_mqtt_broker, extra="mqtt", options=MqttOptions)
)


def _kafka_transport(b: Context) -> Transport:
    from dispatcher.kafka.config import KafkaConfig
    from dispatcher.kafka.transport import KafkaTransport

    return KafkaTransport(KafkaConfig.from_settings(b.settings), clock=b.clock)


TRANSPORTS.add(
    Backend(
        "kafka",
        _kafka_transport,
        check=_needs_kafka,
        extra="kafka",
        provision=(_kafka_topics,),
        description="Apache Kafka or Azure Event Hubs",
        on_executors=_always,
        options=KafkaOptions,
    )
)


# --- command queues ----------------------------------------------------------------------------


def _sql_commands(b: Context) -> CommandQueue:
    return b.sql_queue


def _servicebus_commands(b: Context) -> CommandQueue:
    from dispatcher.servicebus.command_queue import ServiceBusCommandQueue

    return ServiceBusCommandQueue.from_settings(b.settings, clock=b.clock)


COMMAND_QUEUES.add(Backend("sql", _sql_commands, description="the SQL queue on sql_url"))
COMMAND_QUEUES.add(
    Backend(
        "servicebus",
        _servicebus_commands,
        extra="azure",
        # the command queue first, then the destinations (declared for any Service Bus use)
        provision=(_servicebus_command_queue, _servicebus_destinations),
        options=ServiceBusOptions,
    )
)


# --- checkpoint stores -------------------------------------------------------------------------


def _sql_checkpoints(b: Context) -> ClosableCheckpointStore:
    from rescuer.checkpoint import SqlCheckpointStore

    return SqlCheckpointStore(b.settings.sql_url)


def _cosmos_checkpoints(b: Context) -> ClosableCheckpointStore:
    from rescuer.checkpoint_cosmos import CosmosCheckpointStore

    return CosmosCheckpointStore.from_settings(b.settings)


CHECKPOINT_STORES.add(Backend("sql", _sql_checkpoints))
CHECKPOINT_STORES.add(
    Backend(
        "cosmos",
        _cosmos_checkpoints,
        check=_needs_cosmos("checkpoint_store"),
        extra="azure",
        options=CosmosOptions,
    )
)


# --- rescuer engines ---------------------------------------------------------------------------


def _local_engine(b: Context) -> Engine:
    from rescuer.cdf_local import LocalEngine

    return LocalEngine(storage_options=b.settings.storage_options)


def _spark_engine(b: Context) -> Engine:
    from rescuer.cdf_spark import SparkEngine

    return SparkEngine(b.spark_session, storage_options=b.settings.storage_options)


RESCUER_ENGINES.add(Backend("local", _local_engine, description="delta-rs, no JVM"))
RESCUER_ENGINES.add(Backend("spark", _spark_engine, extra="spark", description="PySpark"))


# --- claim logs (two regions, docs/geo.md) -----------------------------------------------------


def _sql_claims(b: Context) -> ClaimLog:
    from dispatcher.claims.sql import SqlClaimLog

    return SqlClaimLog(b.settings.sql_url)


def _cosmos_claims(b: Context) -> ClaimLog:
    from dispatcher.claims.cosmos import CosmosClaimLog

    return CosmosClaimLog.from_settings(b.settings)


CLAIM_LOGS.add(Backend("sql", _sql_claims))
CLAIM_LOGS.add(
    Backend(
        "cosmos",
        _cosmos_claims,
        check=_needs_cosmos("claim_log"),
        extra="azure",
        options=CosmosOptions,
    )
)


# --- consumer inboxes --------------------------------------------------------------------------


def _sql_inbox(b: Context, consumer: str) -> Inbox:
    from dispatcher.queue.inbox import SqlInbox

    return SqlInbox(b.sql_queue.database, consumer)


def _cosmos_inbox(b: Context, consumer: str) -> Inbox:
    from dispatcher.queue.inbox_cosmos import CosmosInbox

    return CosmosInbox.from_settings(b.settings, consumer)


INBOXES.add(Backend("sql", _sql_inbox))
INBOXES.add(
    Backend(
        "cosmos",
        _cosmos_inbox,
        check=_needs_cosmos("inbox_store"),
        extra="azure",
        options=CosmosOptions,
    )
)


# --- provisioning (outbox migrate) -------------------------------------------------------------


def provisioners(settings: Settings) -> list[Provisioner]:
    """What ``outbox migrate`` runs for the backends ``settings`` choose, each step once (the
    command queue's first: it is the outbox's own)."""
    chosen: list[Provisioner] = []
    for registry in (COMMAND_QUEUES, *REGISTRIES):
        for step in registry.checked(settings).provision:
            if step not in chosen:
                chosen.append(step)
    return chosen


def waits_in_sql(settings: Settings) -> tuple[bool, bool]:
    """Whether the messages (``transport``) and the ``ProcessDocument`` commands
    (``command_transport``) wait in the SQL queue's tables, where ``outbox trace`` looks."""
    return settings.transport == "sql", settings.command_transport == "sql"


def sends_from_executors(settings: Settings) -> bool:
    """Does the transport ``settings`` name run on Spark executors (``Backend.on_executors``)?"""
    return TRANSPORTS.checked(settings).on_executors(settings)


def check(settings: Settings) -> None:
    """Every backend ``settings`` name exists and has the settings it needs; the first problem
    raises ``ConfigurationError`` naming the setting."""
    for registry in REGISTRIES:
        registry.checked(settings)

"""``outbox migrate`` on Kafka: the declared destinations become topics, created when missing.

Why only the declared ones: with ``destinations`` empty, any name is valid and there is nothing
to create up front (a send to a missing topic is refused and its messages stay pending). Topics
that exist are left as they are: their partition count is the consumers' contract, and changing
it would move keys between partitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.kafka import errors
from dispatcher.kafka.config import KafkaConfig, load_client
from migrations.runner import Provisioned
from outbox.core.errors import ConfigurationError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

_TIMEOUT = 30.0


def admin_client(config: KafkaConfig) -> Any:
    load_client()  # MissingDependencyError with the extra to install
    from confluent_kafka.admin import AdminClient

    return AdminClient(config.common())


def provision_topics(settings: Settings) -> Provisioned:
    """Create each name in ``destinations`` that the cluster lacks."""
    done = Provisioned()
    if not settings.destinations:
        return done
    config = KafkaConfig.from_settings(settings)
    ck = load_client()
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = admin_client(config)
    try:
        existing = set(admin.list_topics(timeout=_TIMEOUT).topics)
    except ck.KafkaException as e:
        raise errors.translate(
            e.args[0], message_id=None, where=config.describe(), what="outbox migrate"
        ) from None
    missing = [d for d in settings.destinations if d not in existing]
    if not missing:
        return done
    partitions = settings.kafka_partitions or -1  # -1: the broker's num.partitions
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions) for name in missing],
        operation_timeout=_TIMEOUT,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=_TIMEOUT * 2)
        except ck.KafkaException as e:
            err = e.args[0]
            if err.code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:  # another migrate won
                continue
            if err.code() == ck.KafkaError.INVALID_REPLICATION_FACTOR:
                raise ConfigurationError(
                    f"outbox migrate: Kafka at {config.describe()} cannot create topic "
                    f"{name!r}: {err.str()}",
                    hint="the cluster has fewer brokers than its default replication factor; "
                    "create the topic by hand",
                ) from None
            raise errors.translate(
                err, message_id=None, where=config.describe(), what=f"creating topic {name!r}"
            ) from None
        done.actions.append(f"created Kafka topic {name}")
    return done

"""``outbox migrate`` on Kafka: the declared destinations and their dead-letter topics become
topics, created when missing.

Why only the declared ones: with ``destinations`` empty, any name is valid and there is nothing
to create up front (a send to a missing topic is refused and its messages stay pending). Topics
that exist are left as they are: their partition count is the consumers' contract, and changing
it would move keys between partitions.

Why the dead-letter topics too: the consumer helper (``consumer.KafkaConsumer``) dead-letters a
record to ``{topic}.dlt`` and cannot move its partition past the record until that produce
succeeds; a cluster without the topic would stop the partition at the first poison record. Each
gets its topic's partition count and replication factor (the topic's own when it exists, else
``kafka_partitions`` and the broker's default, as the topic gets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.kafka import errors, mapping
from dispatcher.kafka.config import KafkaConfig, load_client
from dispatcher.kafka.topics import DEAD_LETTER_SUFFIX, dead_letter_topic, wait_until_listed
from migrations.runner import Provisioned
from outbox.core.errors import ConfigurationError

if TYPE_CHECKING:
    from outbox.core.settings import Settings

_TIMEOUT = 30.0


def admin_client(config: KafkaConfig) -> Any:
    load_client()  # MissingDependencyError with the extra to install
    from confluent_kafka.admin import AdminClient

    return AdminClient(config.common())


def _wanted(settings: Settings, existing: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, partitions, replication factor) of each topic to create, in the order of
    ``destinations``, each destination's dead-letter topic after it; -1: the broker's default.
    A destination that is itself a dead-letter topic (``orders.dlt``) gets none of its own."""
    partitions = settings.kafka_partitions or -1
    out: list[tuple[str, int, int]] = []
    names: set[str] = set()
    for d in settings.destinations:
        if d not in existing and d not in names:
            out.append((d, partitions, -1))
            names.add(d)
        if d.endswith(DEAD_LETTER_SUFFIX):
            continue
        dlt = dead_letter_topic(d)
        if dlt in existing or dlt in names or dlt in settings.destinations:
            continue
        problem = mapping.topic_problem(dlt)
        if problem:
            raise ConfigurationError(
                f"outbox migrate: the dead-letter topic {dlt!r} of destination {d!r} {problem}",
                hint="shorten the destination's name",
            )
        topic = existing.get(d)
        if topic is not None and topic.partitions:
            first = next(iter(topic.partitions.values()))
            out.append((dlt, len(topic.partitions), len(first.replicas) or -1))
        else:
            out.append((dlt, partitions, -1))
        names.add(dlt)
    return out


def provision_topics(settings: Settings) -> Provisioned:
    """Create each name in ``destinations``, and its ``.dlt`` topic, that the cluster lacks."""
    done = Provisioned()
    if not settings.destinations:
        return done
    config = KafkaConfig.from_settings(settings)
    ck = load_client()
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = admin_client(config)
    try:
        existing = dict(admin.list_topics(timeout=_TIMEOUT).topics)
    except ck.KafkaException as e:
        raise errors.translate(
            e.args[0], message_id=None, where=config.describe(), what="outbox migrate"
        ) from None
    wanted = _wanted(settings, existing)
    if not wanted:
        return done
    futures = admin.create_topics(
        [
            NewTopic(name, num_partitions=partitions, replication_factor=replicas)
            for name, partitions, replicas in wanted
        ],
        operation_timeout=_TIMEOUT,
    )
    for name, _, _ in wanted:
        try:
            futures[name].result(timeout=_TIMEOUT * 2)
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
    try:  # a consumer started right after migrate finds its dead-letter topic
        wait_until_listed(admin, [name for name, _, _ in wanted], _TIMEOUT)
    except ck.KafkaException as e:
        raise errors.translate(
            e.args[0], message_id=None, where=config.describe(), what="outbox migrate"
        ) from None
    return done

"""Reading a topic from one offset to its end as it is now, outside any consumer group's
offsets: for ``outbox dead-letters --kafka-topic``, the tests and the benchmarks.

Why bounded: it reads exactly up to the end offsets taken when it starts, so it never waits for
records that will not come, and it commits nothing (``assign``, not ``subscribe``).
"""

from __future__ import annotations

import time
from typing import Any

from dispatcher.kafka import errors
from dispatcher.kafka.config import KafkaConfig
from outbox.core.errors import MessageNotFoundError


def _config(cluster: KafkaConfig | str, group: str) -> dict[str, Any]:
    config = KafkaConfig(cluster) if isinstance(cluster, str) else cluster
    conf = config.consumer(group)
    conf["enable.auto.commit"] = False
    return conf


def end_offsets(cluster: KafkaConfig | str, topic: str) -> dict[int, int]:
    """Each partition's next offset now: where a read of what comes later starts."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config = KafkaConfig(cluster) if isinstance(cluster, str) else cluster
    c = Consumer(_config(config, "outbox-offsets"))
    try:
        try:
            meta = c.list_topics(topic, timeout=30)
            found = meta.topics.get(topic)
            if found is None or found.error is not None:
                raise MessageNotFoundError(
                    f"Kafka at {config.describe()} has no topic {topic!r}",
                    hint="check the name: a consumer's dead-letter topic is {topic}.dlt",
                )
            return {p: _end_offset(c, TopicPartition(topic, p)) for p in found.partitions}
        except KafkaException as e:
            raise errors.translate(
                e.args[0], message_id=None, where=config.describe(), what=f"reading {topic!r}"
            ) from None
    finally:
        c.close()


# A partition of a topic created a moment ago may have no leader yet: the broker answers "not
# leader" or "leader not available" until the election lands, usually within a second.
_ELECTION_WAIT = 30.0


def _end_offset(c: Any, partition: Any) -> int:
    """The partition's high watermark, waiting (bounded) out a leader election in progress."""
    from confluent_kafka import KafkaError, KafkaException

    transient = {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    deadline = time.monotonic() + _ELECTION_WAIT
    while True:
        try:
            return int(c.get_watermark_offsets(partition, timeout=30)[1])
        except KafkaException as e:
            if e.args[0].code() not in transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_records(
    cluster: KafkaConfig | str,
    topic: str,
    since: dict[int, int] | None = None,
    *,
    timeout: float = 60.0,
) -> list[Any]:
    """Every record of ``topic`` from ``since`` (each partition's offset; default: the start) to
    its end as it is now, partition by partition in offset order (``confluent_kafka.Message``).
    It reads exactly up to the end offsets, so it never waits for records that will not come."""
    from confluent_kafka import Consumer, TopicPartition

    ends = end_offsets(cluster, topic)
    starts = {p: (since or {}).get(p, 0) for p in ends}
    wanted = {p: ends[p] - starts[p] for p in ends if ends[p] > starts[p]}
    if not wanted:
        return []
    c = Consumer(_config(cluster, "outbox-reader"))
    got: dict[int, list[Any]] = {p: [] for p in wanted}
    try:
        c.assign([TopicPartition(topic, p, starts[p]) for p in wanted])
        deadline = time.monotonic() + timeout
        while any(len(got[p]) < wanted[p] for p in wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {sum(map(len, got.values()))} of {sum(wanted.values())}")
            for m in c.consume(1000, 0.5):
                p = m.partition()
                if m.error() is None and p is not None and len(got[p]) < wanted[p]:
                    got[p].append(m)
    finally:
        c.close()
    return [m for p in sorted(got) for m in got[p]]

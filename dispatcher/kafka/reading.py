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
    return {p: high for p, (_, high) in watermarks(cluster, topic).items()}


def watermarks(cluster: KafkaConfig | str, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (first offset still kept, next offset) now."""
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
            return {p: _marks(c, TopicPartition(topic, p)) for p in found.partitions}
        except KafkaException as e:
            raise errors.translate(
                e.args[0], message_id=None, where=config.describe(), what=f"reading {topic!r}"
            ) from None
    finally:
        c.close()


# A partition of a topic created a moment ago may have no leader yet: the broker answers "not
# leader" or "leader not available" until the election lands, usually within a second.
_ELECTION_WAIT = 30.0


def _marks(c: Any, partition: Any) -> tuple[int, int]:
    """The partition's watermarks, waiting (bounded) out a leader election in progress."""
    from confluent_kafka import KafkaError, KafkaException

    transient = {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    deadline = time.monotonic() + _ELECTION_WAIT
    while True:
        try:
            low, high = c.get_watermark_offsets(partition, timeout=30)
            return int(low), int(high)
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
    marks = watermarks(cluster, topic)
    ranges = {p: (max(low, (since or {}).get(p, 0)), high) for p, (low, high) in marks.items()}
    return read_ranges(cluster, topic, ranges, timeout=timeout)


def read_ranges(
    cluster: KafkaConfig | str,
    topic: str,
    ranges: dict[int, tuple[int, int]],
    *,
    timeout: float = 60.0,
) -> list[Any]:
    """The records of each partition with offsets in ``[start, end)`` (``ranges``), partition by
    partition in offset order. A partition is done when a record at ``end - 1`` or later comes,
    or its position reaches ``end``: offsets need not be dense (transaction markers, a compacted
    topic) and the oldest may be gone (retention: the read starts at the first one kept)."""
    from confluent_kafka import Consumer, TopicPartition

    wanted = {p: (start, end) for p, (start, end) in ranges.items() if end > start}
    if not wanted:
        return []
    c = Consumer(_config(cluster, "outbox-reader"))
    got: dict[int, list[Any]] = {p: [] for p in wanted}
    open_ = set(wanted)
    try:
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in wanted.items()])
        deadline = time.monotonic() + timeout
        while open_:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {sum(map(len, got.values()))} records of {topic!r}")
            # as many as are still wanted: consume returns when it has them, not at its timeout
            left = sum(wanted[p][1] - max(wanted[p][0], _next(got[p])) for p in open_)
            for m in c.consume(max(1, min(1000, left)), 0.5):
                p, offset = m.partition(), m.offset()
                if m.error() is not None or p not in open_ or offset is None:
                    continue
                start, end = wanted[p]
                if start <= offset < end:
                    got[p].append(m)
                if offset >= end - 1:
                    open_.discard(p)
            for tp in c.position([TopicPartition(topic, p) for p in open_]):
                if tp.offset >= wanted[tp.partition][1]:
                    open_.discard(tp.partition)
    finally:
        c.close()
    return [m for p in sorted(got) for m in got[p]]


def _next(records: list[Any]) -> int:
    """The offset after the last record read (0 before any)."""
    return int(records[-1].offset()) + 1 if records else 0

"""Dead-letter topics: their names, whether the cluster has them, and how to create them.

Why one place: ``outbox migrate`` creates ``{topic}.dlt`` next to each declared destination, the
consumer helper checks at start-up that its dead-letter topics exist and names the same fix when
a dead-letter produce fails; the three must agree on the name and on the fix they print.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dispatcher.kafka.config import KafkaConfig

#: The consumer helper's default dead-letter topic; ``outbox migrate`` creates this one.
DEAD_LETTER_TEMPLATE = "{topic}.dlt"
DEAD_LETTER_SUFFIX = ".dlt"


def dead_letter_topic(topic: str, template: str = DEAD_LETTER_TEMPLATE) -> str:
    return template.replace("{topic}", topic)


def missing_topics(client: Any, names: Iterable[str], timeout: float) -> list[str]:
    """The names the cluster lacks, one metadata request each through ``client``'s own
    ``list_topics`` (a consumer or producer: no admin rights needed, and nothing is created,
    since the clients ask with auto-creation off). A topic the cluster refuses to describe
    (not authorized) counts as present: its produce says why. Raises ``KafkaException`` when
    the cluster does not answer within ``timeout``."""
    from confluent_kafka import KafkaError

    unknown = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
    out = []
    for name in names:
        found = client.list_topics(topic=name, timeout=timeout).topics.get(name)
        if found is None or (found.error is not None and found.error.code() in unknown):
            out.append(name)
    return out


def create_hint(missing: list[str], config: KafkaConfig, template: str) -> str:
    """How to create ``missing`` dead-letter topics: ``outbox migrate`` when the template is
    the default (it creates that one), else the Kafka command."""
    also = f" (and likewise {', '.join(missing[1:])})" if len(missing) > 1 else ""
    command = (
        f"kafka-topics.sh --bootstrap-server {config.bootstrap_servers} --create "
        f"--topic {missing[0]}{also}"
    )
    if template != DEAD_LETTER_TEMPLATE:
        return f"create it: {command}"
    return (
        "run outbox migrate with the topic in destinations, which creates {destination}.dlt "
        f"for each, or create it: {command}"
    )

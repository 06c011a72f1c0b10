"""Dead-letter topics: their names, whether the cluster has them, and how to create them.

Why one place: ``outbox migrate`` creates ``{topic}.dlt`` next to each declared destination, the
consumer helper checks at start-up that its dead-letter topics exist and names the same fix when
a dead-letter produce fails; the three must agree on the name and on the fix they print.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from dispatcher.kafka.config import KafkaConfig
from outbox.core.errors import ConfigurationError, TransportError

log = logging.getLogger("outbox.kafka.consumer")

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


def wait_until_listed(client: Any, names: Iterable[str], timeout: float) -> list[str]:
    """Wait until the cluster lists each of ``names``; the names still unlisted at ``timeout``.
    Why: CreateTopics returns once the controller committed the topic, and a broker lists it
    only after it applied that record, a moment later; a consumer started at once would
    otherwise find its dead-letter topic missing."""
    deadline = time.monotonic() + timeout
    missing = list(names)
    while missing:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        missing = missing_topics(client, missing, max(0.1, min(left, 5.0)))
    return missing


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


def require_dead_letter_topics(
    client: Any, config: KafkaConfig, subscribed: list[str], template: str, *, timeout: float
) -> None:
    """The consumer's start-up check: ``ConfigurationError`` naming each missing dead-letter
    topic and the fix. A cluster that does not answer is only a warning (a failing dead-letter
    produce later waits and names the same fix); a ``^regex`` subscription's topics are known
    only from its records, so it is not checked."""
    from confluent_kafka import KafkaException

    wanted = sorted({dead_letter_topic(t, template) for t in subscribed if not t.startswith("^")})
    try:
        missing = missing_topics(client, wanted, timeout)
    except KafkaException as e:
        log.warning(
            "could not look up the dead-letter topics %s at %s (%s); a missing one makes a "
            "failing record wait in its partition",
            ", ".join(wanted),
            config.describe(),
            e.args[0].str() if e.args else e,
        )
        return
    if missing:
        raise ConfigurationError(
            f"Kafka at {config.describe()} has no dead-letter topic "
            f"{', '.join(repr(m) for m in missing)}: the consumer of {', '.join(subscribed)} "
            "cannot start without it (a record failing its handler would stop its partition)",
            hint=create_hint(missing, config, template),
        )


def produce_fix(
    client: Any,
    config: KafkaConfig,
    topic: str,
    template: str,
    error: TransportError,
    *,
    timeout: float,
) -> str:
    """The consumer's fix for a failed dead-letter produce (the transport's own hint is about
    the outbox's commands): how to create the topic when the cluster lacks it, else what to
    look at."""
    from confluent_kafka import KafkaException

    if not error.retryable:  # a refusal: is it the topic that is missing?
        try:
            if missing_topics(client, [topic], timeout):
                return create_hint([topic], config, template)
        except KafkaException:
            pass
    return (
        f"fix what the error names for {topic} (the brokers, the login, the topic's "
        "max.message.bytes); the record is dead-lettered once a produce succeeds"
    )

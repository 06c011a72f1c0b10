"""``KafkaConsumer``: read outbox messages from Kafka in a consumer group, handle each once.

The field's usual pattern (Spring Kafka's error handler with a dead-letter topic):

* Each partition is handled in offset order, one record at a time; the offsets are committed
  only after the handlers of the records before them returned (at-least-once), so a crashed
  member's successor starts at the first record not handled.
* Repeats (a re-send by the outbox, a re-delivery after a crash before the commit) are dropped
  through the inbox: the message id is claimed before the handler and recorded after it.
* A failing handler is retried in place, ``max_tries`` times with exponential backoff (the
  partition waits: a key's later messages never overtake it); then the record goes to the
  dead-letter topic (``{topic}.dlt`` by default) with headers saying why, and the partition
  moves on. ``UnprocessableMessageError`` dead-letters at once. If the dead-letter topic cannot
  take it, nothing is committed past the record and it is handled again later.

Retrying in place bounds how long a handler may fail: the whole retry must fit in the
consumer's ``max.poll.interval.ms`` (default 5 minutes), or the group moves the partition to
another member, which starts the record again (the inbox keeps that to one success).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from dispatcher.kafka import mapping
from dispatcher.kafka.config import KafkaConfig, load_client
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.inbox import Inbox
from dispatcher.transports.base import TransportMessage
from outbox.core.backoff import ExponentialBackoff
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import ConfigurationError, TransportError, UnprocessableMessageError

log = logging.getLogger("outbox.kafka.consumer")

#: Headers a dead-lettered record gets on top of its own (Spring Kafka names them alike).
DLT_REASON = "outbox-dead-letter-reason"
DLT_ERROR = "outbox-dead-letter-error"
DLT_TOPIC = "outbox-dead-letter-topic"
DLT_PARTITION = "outbox-dead-letter-partition"
DLT_OFFSET = "outbox-dead-letter-offset"
DLT_TRIES = "outbox-dead-letter-tries"
DLT_GROUP = "outbox-dead-letter-group"
DLT_HEADERS = (DLT_REASON, DLT_ERROR, DLT_TOPIC, DLT_PARTITION, DLT_OFFSET, DLT_TRIES, DLT_GROUP)

Handler = Callable[[TransportMessage], object]


@dataclass
class BatchReport:
    handled: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retried: int = 0
    #: partitions whose rest of the batch waits for the next poll (a held claim, a failed DLT)
    rewound: int = 0


@dataclass(frozen=True)
class KafkaConsumerOptions:
    """The knobs of a ``KafkaConsumer`` (each may also be given as a keyword)."""

    #: drops repeats by message id (``dispatcher.queue.inbox``); None: every delivery runs
    inbox: Inbox | None = None
    #: tries of a failing handler before the record is dead-lettered
    max_tries: int = 3
    backoff: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=0.5, cap=30.0, jitter=0.1)
    )
    #: where a record goes after its last try; ``{topic}`` is the record's topic
    dead_letter_topic: str = "{topic}.dlt"
    #: records per poll
    batch_size: int = 500
    #: the inbox claim's lease, seconds
    lease: float = 300.0


class KafkaConsumer:
    """A consumer-group member running ``handler`` once per message id."""

    def __init__(
        self,
        config: KafkaConfig | str,
        topics: Sequence[str],
        group: str,
        handler: Handler,
        *,
        options: KafkaConsumerOptions | None = None,
        clock: Clock | None = None,
        consumer: Any = None,
        **kw: Any,
    ) -> None:
        """``consumer``: a ``confluent_kafka.Consumer`` made elsewhere (tests), else one is made
        from ``config`` for ``group``. ``kw``: fields of ``KafkaConsumerOptions``."""
        opts = replace(options or KafkaConsumerOptions(), **kw)
        if opts.max_tries < 1:
            raise ConfigurationError("max_tries must be at least 1")
        if "{topic}" not in opts.dead_letter_topic and len(topics) > 1:
            raise ConfigurationError(
                "one dead-letter topic for several topics loses where each record came from",
                hint="use a template with {topic}, e.g. {topic}.dlt",
            )
        self.config = KafkaConfig(config) if isinstance(config, str) else config
        self.topics = list(topics)
        self.group = group
        self.handler = handler
        self.options = opts
        self.inbox = opts.inbox
        self.lease = timedelta(seconds=opts.lease)
        self.clock = clock or SystemClock()
        self.owner = f"{group}/{uuid.uuid4().hex[:12]}"
        self._where = self.config.describe()
        self._ck = load_client()
        self._stop = threading.Event()
        self.consumer = consumer or self._ck.Consumer(self.config.consumer(group))
        self._dead_letters: KafkaTransport | None = None
        self.consumer.subscribe(self.topics)

    @property
    def dead_letters(self) -> KafkaTransport:
        """The dead-letter topic's producer, made on first use: the outbox's own transport,
        so a missing topic is refused at once instead of after the send timeout."""
        if self._dead_letters is None:
            self._dead_letters = KafkaTransport(self.config, clock=self.clock)
        return self._dead_letters

    # --- the loop ----------------------------------------------------------------------------

    def run_once(self, timeout: float = 1.0) -> BatchReport:
        """Poll one batch, handle it partition by partition, commit what was handled."""
        report = BatchReport()
        records = self.consumer.consume(self.options.batch_size, timeout)
        stopped: set[tuple[str, int]] = set()
        done: dict[tuple[str, int], int] = {}
        for record in records:
            err = record.error()
            if err is not None:
                if err.code() != self._ck.KafkaError._PARTITION_EOF:
                    log.warning("Kafka at %s: %s", self._where, err.str())
                continue
            tp = (record.topic(), record.partition())
            if tp in stopped:
                continue
            if self._handle(record, report):
                done[tp] = record.offset() + 1
            else:  # this record waits: read the partition again from it
                stopped.add(tp)
                report.rewound += 1
                self.consumer.seek(
                    self._ck.TopicPartition(record.topic(), record.partition(), record.offset())
                )
        if done:
            try:
                self.consumer.commit(
                    offsets=[self._ck.TopicPartition(t, p, o) for (t, p), o in done.items()],
                    asynchronous=False,
                )
            except self._ck.KafkaException as e:  # a rebalance took the partitions meanwhile
                log.warning(
                    "offsets not committed (%s): the partitions' next owner handles those "
                    "records again, and the inbox drops the repeats",
                    e.args[0].str() if e.args else e,
                )
        return report

    def run_forever(self, timeout: float = 1.0) -> None:
        while not self._stop.is_set():
            self.run_once(timeout)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.consumer.close()
        if self._dead_letters is not None:
            self._dead_letters.close()

    # --- one record --------------------------------------------------------------------------

    def _handle(self, record: Any, report: BatchReport) -> bool:
        """True when the record is done with (handled, a repeat, dead-lettered)."""
        msg = mapping.record_of(record)
        key = msg.message_id or f"{record.topic()}/{record.partition()}/{record.offset()}"
        if self.inbox is not None:
            claim = self.inbox.claim(key, self.owner, lease=self.lease, at=self.clock.now())
            if claim.handled:
                report.duplicates += 1
                return True
            if claim.held:  # another member handles it now (a rebalance): look again later
                return False
        tries = 0
        while True:
            tries += 1
            try:
                self.handler(msg)
            except UnprocessableMessageError as e:
                return self._dead_letter(record, key, report, why=("Unprocessable", e, tries))
            except Exception as e:
                if tries >= self.options.max_tries:
                    return self._dead_letter(
                        record, key, report, why=("MaxTriesExceeded", e, tries)
                    )
                report.retried += 1
                log.info(
                    "handler failed on %s (try %d of %d): %s", key, tries, self.options.max_tries, e
                )
                self.clock.sleep(self.options.backoff(tries))
                continue
            if self.inbox is not None:
                self.inbox.record(key, at=self.clock.now())
            report.handled += 1
            return True

    def _dead_letter(
        self, record: Any, key: str, report: BatchReport, *, why: tuple[str, BaseException, int]
    ) -> bool:
        reason, error, tries = why
        topic = self.options.dead_letter_topic.replace("{topic}", record.topic())
        dead = mapping.record_of(record)
        dead.destination = topic
        dead.message_id = dead.message_id or key
        dead.headers.update(
            {
                DLT_REASON: reason,
                DLT_ERROR: f"{type(error).__name__}: {error}"[:4000],
                DLT_TOPIC: record.topic(),
                DLT_PARTITION: str(record.partition()),
                DLT_OFFSET: str(record.offset()),
                DLT_TRIES: str(tries),
                DLT_GROUP: self.group,
            }
        )
        try:
            self.dead_letters.send([dead])
        except TransportError as e:
            log.error(
                "could not dead-letter %s to %s (it is handled again later): %s", key, topic, e
            )
            if self.inbox is not None:
                self.inbox.release(key, self.owner)
            return False
        if self.inbox is not None:  # not recorded: a requeued copy must run the handler
            self.inbox.release(key, self.owner)
        log.warning("dead-lettered %s to %s after %d tries: %s", key, topic, tries, error)
        report.dead_lettered += 1
        return True

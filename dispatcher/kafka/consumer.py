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
  moves on. ``UnprocessableMessageError`` dead-letters at once.
* The dead-letter topics must exist: the consumer looks them up at start-up and refuses to start
  without them (``outbox migrate`` creates ``{topic}.dlt`` for each declared destination). If a
  dead-letter produce fails anyway (the topic deleted since, the brokers down), nothing is
  committed past the record: its partition is paused and the produce tried again after a
  backoff on the injected clock (``dead_letter_backoff``), with the verdict kept (the handler
  does not run again), until it succeeds. Nothing is lost and nothing overtakes the record.

Retrying in place bounds how long a handler may fail: the whole retry must fit in the
consumer's ``max.poll.interval.ms`` (default 5 minutes), or the group moves the partition to
another member, which starts the record again (the inbox keeps that to one success).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from dispatcher.kafka import mapping
from dispatcher.kafka import topics as kafka_topics
from dispatcher.kafka.config import KafkaConfig, load_client
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.inbox import Inbox
from dispatcher.queue.inbox_pruning import InboxPruner
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

#: How long the start-up lookup of the dead-letter topics may take before it gives up (and
#: only warns: a cluster that is down does not stop a consumer from starting).
LOOKUP_TIMEOUT = 10.0


@dataclass
class BatchReport:
    handled: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    retried: int = 0
    #: partitions whose rest of the batch waits for the next poll (a held claim, a failed DLT)
    rewound: int = 0
    #: dead-letter produces that failed (each pauses its partition for a backoff)
    dead_letter_failed: int = 0


@dataclass
class _Waiting:
    """A record whose dead-letter produce failed: its verdict, and when to try again."""

    offset: int
    why: tuple[str, BaseException, int]
    failures: int
    until: datetime
    paused: bool = False


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
    dead_letter_topic: str = kafka_topics.DEAD_LETTER_TEMPLATE
    #: waits between failed dead-letter produces of one record (its partition is paused)
    dead_letter_backoff: ExponentialBackoff = field(
        default_factory=lambda: ExponentialBackoff(base=1.0, cap=60.0, jitter=0.1)
    )
    #: records per poll
    batch_size: int = 500
    #: the inbox claim's lease, seconds
    lease: float = 300.0
    #: how long a handled id stays in the inbox (``inbox_retention``; default a week); the
    #: consumer deletes older ones itself, at most once an hour by its clock
    inbox_retention: float | None = None


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
        self.clock = clock or SystemClock()
        self.pruner = (
            None
            if opts.inbox is None
            else InboxPruner(opts.inbox, self.clock, retention=opts.inbox_retention)
        )
        self.lease = timedelta(seconds=opts.lease)
        self.owner = f"{group}/{uuid.uuid4().hex[:12]}"
        self._where = self.config.describe()
        self._ck = load_client()
        self._stop = threading.Event()
        self.consumer = consumer or self._ck.Consumer(self.config.consumer(group))
        self._dead_letters: KafkaTransport | None = None
        self._waiting: dict[tuple[str, int], _Waiting] = {}
        try:
            self._check_dead_letter_topics()
        except BaseException:
            self.consumer.close()
            raise
        self.consumer.subscribe(self.topics)

    def dead_letter_topic(self, topic: str) -> str:
        return kafka_topics.dead_letter_topic(topic, self.options.dead_letter_topic)

    def _check_dead_letter_topics(self) -> None:
        """Refuse to start without a dead-letter topic: the first record that fails its handler
        would otherwise stop its partition."""
        kafka_topics.require_dead_letter_topics(
            self.consumer,
            self.config,
            self.topics,
            self.options.dead_letter_topic,
            timeout=min(LOOKUP_TIMEOUT, self.config.send_timeout),
        )

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
        self._resume_due()
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
                self._pause_if_waiting(tp)
        if self.pruner is not None:
            self.pruner.maybe_prune()
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

    # --- a partition waiting for its dead-letter produce -------------------------------------

    def _pause_if_waiting(self, tp: tuple[str, int]) -> None:
        """Pause a partition whose record waits for its dead-letter produce: paused, the polls
        do not fetch it again at once (the produce would fail in a tight loop)."""
        waiting = self._waiting.get(tp)
        if waiting is None or waiting.paused:
            return
        with contextlib.suppress(self._ck.KafkaException):  # not ours any more (a rebalance)
            self.consumer.pause([self._ck.TopicPartition(*tp)])
            waiting.paused = True

    def _resume_due(self) -> None:
        now = self.clock.now()
        due = [tp for tp, w in self._waiting.items() if w.paused and w.until <= now]
        if not due:
            return
        for tp in due:
            self._waiting[tp].paused = False
        # revoked meanwhile: its next assignment is not paused anyway
        with contextlib.suppress(self._ck.KafkaException):
            self.consumer.resume([self._ck.TopicPartition(*tp) for tp in due])

    # --- one record --------------------------------------------------------------------------

    def _handle(self, record: Any, report: BatchReport) -> bool:
        """True when the record is done with (handled, a repeat, dead-lettered)."""
        tp = (record.topic(), record.partition())
        waiting = self._waiting.get(tp)
        if waiting is not None and waiting.offset != record.offset():
            del self._waiting[tp]  # settled by another member while the partition was away
            waiting = None
        if waiting is not None and self.clock.now() < waiting.until:
            waiting.paused = False  # it came back unpaused (a rebalance): pause it again
            return False
        msg = mapping.record_of(record)
        key = msg.message_id or f"{record.topic()}/{record.partition()}/{record.offset()}"
        if self.inbox is not None:
            claim = self.inbox.claim(key, self.owner, lease=self.lease, at=self.clock.now())
            if claim.handled:
                self._waiting.pop(tp, None)
                report.duplicates += 1
                return True
            if claim.held:  # another member handles it now (a rebalance): look again later
                return False
        if waiting is not None:  # the handler gave its verdict already: only the produce again
            return self._dead_letter(record, key, report, why=waiting.why)
        return self._run_handler(record, msg, key, report)

    def _run_handler(
        self, record: Any, msg: TransportMessage, key: str, report: BatchReport
    ) -> bool:
        """The handler, retried in place; dead-letters the record after its last try."""
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
        topic = self.dead_letter_topic(record.topic())
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
            if self.inbox is not None:
                self.inbox.release(key, self.owner)
            self._wait_after_failure(record, key, topic, why, e)
            report.dead_letter_failed += 1
            return False
        self._waiting.pop((record.topic(), record.partition()), None)
        if self.inbox is not None:  # not recorded: a requeued copy must run the handler
            self.inbox.release(key, self.owner)
        log.warning("dead-lettered %s to %s after %d tries: %s", key, topic, tries, error)
        report.dead_lettered += 1
        return True

    def _wait_after_failure(
        self,
        record: Any,
        key: str,
        topic: str,
        why: tuple[str, BaseException, int],
        error: TransportError,
    ) -> None:
        """Remember the verdict and back off; one line with the consumer's own fix (the
        transport's hint is about the outbox's commands, not about this record)."""
        tp = (record.topic(), record.partition())
        before = self._waiting.get(tp)
        failures = before.failures + 1 if before is not None else 1
        delay = self.options.dead_letter_backoff(failures)
        self._waiting[tp] = _Waiting(
            record.offset(), why, failures, self.clock.now() + timedelta(seconds=delay)
        )
        text = str(error)
        if error.hint and text.endswith(f" (fix: {error.hint})"):
            text = text[: -len(f" (fix: {error.hint})")]
        fix = kafka_topics.produce_fix(
            self.consumer,
            self.config,
            topic,
            self.options.dead_letter_topic,
            error,
            timeout=LOOKUP_TIMEOUT,
        )
        log.error(
            "could not dead-letter %s (%s partition %d offset %d) to %s: %s; the partition "
            "waits at this record, nothing committed past it, and tries again in %.3gs, "
            "failure %d (fix: %s)",
            key,
            tp[0],
            tp[1],
            record.offset(),
            topic,
            text,
            delay,
            failures,
            fix,
        )

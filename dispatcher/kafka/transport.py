"""``KafkaTransport``: an idempotent Kafka producer under the outbox (Kafka and Event Hubs).

A ``TransportMessage`` becomes one record on the topic named by its destination: the ordering
key is the Kafka key (one partition per key, so per-key order is partition order), the body is
the value, and the fields travel as headers (``mapping``). ``send`` returns only when the broker
acknowledged every record with ``acks=all``; the producer is idempotent, so its own retries never
duplicate or reorder a partition.

Refused up front, as ``PermanentTransportError`` naming the message, before anything of the batch
is produced: a destination that is not a topic name, a topic the cluster does not have (looked up
once and remembered), a header with a reserved name, a ``scheduled_at`` in the future (Kafka has
no scheduled delivery). A batch is otherwise not atomic (``atomic_batches = False``): when the
broker fails a record midway, earlier records may be out, and the caller re-sends the batch with
the same ids; consumers drop repeats by ``outbox-message-id`` (the consumer helper's inbox).

Thread safe: one producer serves every thread. Each ``send`` serves delivery reports itself
while it waits for its own (librdkafka calls them only from ``poll``, on the polling thread): a
report for another thread's send sets that send's event. No thread of its own: a background
poller would take the GIL for every report while the sender produces, which cost a quarter of
the throughput (benchmarks/kafka.py). Documents may share one send (``coalesce_sends``): many
records per round trip, and a failed batch is re-sent per document with the same ids. The
dispatcher keeps several such sends in flight at once (never two of one ordering key), so one
send's reports are often served by another's poll (``_Pending``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from dispatcher.kafka import errors, mapping
from dispatcher.kafka.config import KafkaConfig, load_client
from dispatcher.transports.base import TransportMessage
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import (
    ClosedError,
    PermanentTransportError,
    TransportError,
)

log = logging.getLogger("outbox.kafka")

#: How long one wait for delivery reports blocks before it looks at the send's state again
#: (it returns at once when it serves one).
_POLL = 0.01


def _refused(m: TransportMessage, why: str, hint: str | None = None) -> PermanentTransportError:
    return PermanentTransportError(
        f"message {m.message_id}: {why}", message_id=m.message_id, hint=hint
    )


def _positions(
    batch: Sequence[TransportMessage], failed: list[tuple[Any, Any]]
) -> list[tuple[int, Any]]:
    """Where in ``batch`` each failed record was: by its message id header, or (a delivery
    report of a refused record may come without headers) by its key and value."""
    out = []
    for err, record in failed:
        mid = next(
            (
                bytes(v or b"").decode()
                for k, v in record.headers() or ()
                if k == mapping.MESSAGE_ID
            ),
            None,
        )
        key, value = record.key(), record.value()
        for i, m in enumerate(batch):
            if m.message_id == mid or (
                mid is None
                and m.body == value
                and (m.session_id.encode() if m.session_id is not None else None) == key
            ):
                out.append((i, err))
                break
        else:
            out.append((0, err))
    return out


class _Pending:
    """One send's records: a delivery report fills each slot; ``done`` when all have one.

    Reports of one send may be served by several threads at once (each sending thread polls,
    and a poll serves whatever reports are ready, another send's too), so the count is an
    ``itertools.count``: its ``next`` is one step under the GIL, where ``remaining -= 1`` is a
    read and a write another thread may come between (a lost report, a send waiting forever).
    A failed record's ``list.append`` is one step too."""

    __slots__ = ("_count", "done", "failed", "n")

    def __init__(self, n: int) -> None:
        self.failed: list[tuple[Any, Any]] = []
        self.n = n
        self._count = itertools.count(1)
        self.done = threading.Event()

    def report(self, err: Any, msg: Any) -> None:
        """The delivery callback of every record of the send (one bound method, not a closure
        per record); a failed record is found by its message id header."""
        if err is not None:
            self.failed.append((err, msg))
        if next(self._count) >= self.n:
            self.done.set()

    def skip(self, n: int) -> None:
        """``n`` slots that will never get a report (they were not produced)."""
        for _ in range(n):
            self.report(None, None)


class KafkaTransport:
    """A ``Transport`` producing to Kafka (or Event Hubs' Kafka endpoint)."""

    #: Refusals are found before producing, but a broker failing midway may leave a prefix out.
    atomic_batches = False
    #: Many documents per send: one round trip for up to the dispatcher's batch of records.
    coalesce_sends = True

    def __init__(
        self,
        config: KafkaConfig | str,
        *,
        clock: Clock | None = None,
        producer: Any = None,
    ) -> None:
        """``config``: a ``KafkaConfig`` or bootstrap servers. The producer connects in the
        background: a cluster that is down does not stop ``Outbox.open`` (sends fail retryably
        until it is back)."""
        self.config = KafkaConfig(config) if isinstance(config, str) else config
        self.clock = clock or SystemClock()
        self._where = self.config.describe()
        self._topics: set[str] = set()
        self._topics_lock = threading.Lock()
        self._connection_error: Any = None  # the last error the client reported, if any
        self._closed = False
        self._ck = load_client()
        self._producer = producer
        self._producer_lock = threading.Lock()
        self._logged: set[str] = set()  # kinds of client trouble logged since the last success

    @property
    def producer(self) -> Any:
        """Made on first use: a writer that only defers dispatch never connects."""
        if self._producer is None:
            with self._producer_lock:
                if self._producer is None:
                    conf = self.config.producer()
                    conf["error_cb"] = self._on_client_error
                    self._producer = self._ck.Producer(conf)
        return self._producer

    # --- sending -----------------------------------------------------------------------------

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if self._closed:
            raise ClosedError("the Kafka transport is closed", hint="build a new transport")
        if not batch:
            return
        unknown = self._check(batch)  # every refusal before anything goes out
        if unknown:
            self._require_topics(batch, unknown)
        pending = _Pending(len(batch))
        produced = 0
        failure: TransportError | None = None
        producer, report, headers_of = self.producer, pending.report, mapping.headers_of
        for m in batch:
            key = m.session_id.encode() if m.session_id is not None else None
            while True:
                try:
                    producer.produce(
                        m.destination,
                        value=m.body,
                        key=key,
                        headers=headers_of(m),
                        on_delivery=report,
                    )
                    break
                except BufferError:  # the local queue is full: wait for reports to make room
                    producer.poll(_POLL)
                except self._ck.KafkaException as e:
                    failure = errors.translate(
                        e.args[0], message_id=m.message_id, where=self._where
                    )
                    break
            if failure is not None:
                break
            produced += 1
        if produced < len(batch):
            pending.skip(len(batch) - produced)
        self._wait(pending, batch)
        if pending.failed:
            index, err = min(_positions(batch, pending.failed))
            raise errors.translate(
                err,
                message_id=batch[index].message_id,
                where=self._where,
                cause=self._connection_error,
            )
        if failure is not None:
            raise failure
        if self._connection_error is not None:  # a whole batch went through: the cluster is fine
            self._connection_error = None
            self._logged.clear()

    def _check(self, batch: Sequence[TransportMessage]) -> set[str] | None:
        """Refuse a message Kafka cannot take (one pass, no work per message beyond the tests);
        returns the destinations not known to be topics yet (None: all known)."""
        known = self._topics  # read without the lock: names are only ever added to it
        unknown: set[str] | None = None
        now: datetime | None = None
        for m in batch:
            if m.destination not in known and (unknown is None or m.destination not in unknown):
                problem = mapping.topic_problem(m.destination)
                if problem:
                    raise _refused(m, f"destination {m.destination!r} {problem}")
                if unknown is None:
                    unknown = set()
                unknown.add(m.destination)
            if m.scheduled_at is not None:
                now = self.clock.now() if now is None else now
                if m.scheduled_at > now:
                    raise _refused(
                        m,
                        f"scheduled for {m.scheduled_at.isoformat()}, and Kafka has no scheduled "
                        "delivery",
                        "schedule on the SQL queue or Service Bus and forward from there",
                    )
            if m.headers:
                taken = mapping.reserved_header(m)
                if taken:
                    raise _refused(
                        m, f"header {taken!r} is reserved for the transport's own fields"
                    )
        return unknown

    def _wait(self, pending: _Pending, batch: Sequence[TransportMessage]) -> None:
        """Wait until each record has its delivery report. librdkafka gives every record one
        within ``message.timeout.ms`` (the send timeout); a failed authentication ends the wait
        at once, since no record can be delivered until the credentials change."""
        producer = self.producer
        while not pending.done.is_set():
            producer.poll(_POLL)  # returns as soon as it served a report
            err = self._connection_error
            if err is not None and errors.is_auth(err):
                raise errors.translate(err, message_id=batch[0].message_id, where=self._where)

    # --- topics ------------------------------------------------------------------------------

    def _require_topics(self, batch: Sequence[TransportMessage], unknown: set[str]) -> None:
        """Refuse a batch naming a topic the cluster lacks, before producing any of it: with
        auto-create off, librdkafka would otherwise hold such a record for the whole send
        timeout. A known topic is remembered; an unknown one is asked again next time."""
        for topic in sorted(unknown):
            if topic in self._topics or self._topic_exists(topic, batch):
                with self._topics_lock:
                    self._topics.add(topic)
                continue
            first = next(m for m in batch if m.destination == topic)
            raise PermanentTransportError(
                f"message {first.message_id}: Kafka at {self._where} has no topic {topic!r} "
                "(and does not create topics on use)",
                message_id=first.message_id,
                hint="create the topic (outbox migrate creates the declared destinations), then "
                "requeue the command with outbox dead-letters requeue; the messages stay pending",
            )

    def _topic_exists(self, topic: str, batch: Sequence[TransportMessage]) -> bool:
        ck = self._ck
        deadline = time.monotonic() + self.config.send_timeout
        while True:
            self.producer.poll(0)  # serve the error callback: a failed login ends the wait
            err = self._connection_error
            if err is not None and errors.is_auth(err):
                raise errors.translate(err, message_id=batch[0].message_id, where=self._where)
            left = deadline - time.monotonic()
            try:
                meta = self.producer.list_topics(topic, timeout=max(0.05, min(1.0, left)))
            except ck.KafkaException as e:
                if time.monotonic() < deadline:
                    continue
                raise errors.translate(
                    e.args[0],
                    message_id=batch[0].message_id,
                    where=self._where,
                    what=f"message {batch[0].message_id}: looking up topic {topic!r}",
                    cause=self._connection_error,
                ) from None
            found = meta.topics.get(topic)
            if found is None:
                return False
            if found.error is None:
                return True
            if found.error.code() in (
                ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
                ck.KafkaError._UNKNOWN_TOPIC,
            ):
                return False
            raise errors.translate(found.error, message_id=batch[0].message_id, where=self._where)

    # --- the client's own reports ------------------------------------------------------------

    def _on_client_error(self, err: Any) -> None:
        """librdkafka reports connection trouble here (the records themselves wait and retry
        until the send timeout). Remembered for the sends, which name it when they fail; logged
        once per kind of trouble until a send succeeds again."""
        self._connection_error = err
        kind = "auth" if errors.is_auth(err) else "down" if errors.is_unreachable(err) else "other"
        if kind not in self._logged:
            self._logged.add(kind)
            log.log(
                logging.INFO if kind == "down" else logging.WARNING,
                "Kafka at %s: %s",
                self._where,
                err.str(),
            )

    @property
    def healthy(self) -> bool:
        return self._connection_error is None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._producer is not None:
            self._producer.flush(min(self.config.send_timeout, 5.0))

"""A dead-letter topic as ``outbox dead-letters`` sees it: list, show, requeue (purge refused).

Why a class of its own: the CLI's commands take any object with the SQL queue's dead-letter
methods, so a dead-letter topic written by ``consumer.KafkaConsumer`` answers the same calls.
What Kafka cannot do is said, not faked: a record cannot be deleted from a topic (it leaves when
the topic's retention ends), so ``purge`` raises ``ValidationError`` with the fix, and a requeued
record stays in the dead-letter topic too (requeueing it twice sends two copies with the same
message id; the consumer's inbox runs the handler once).

Ids: the record's offset plus one (``offset + 1``), plus ``partition * 1,000,000,000`` on
partitions after the first, so a one-partition dead-letter topic reads 1, 2, 3...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dispatcher.kafka import consumer as c
from dispatcher.kafka import mapping
from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.reading import read_ranges, read_records, watermarks
from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.messages import DeadLetter
from dispatcher.queue.selection import DeadLetterSelection
from outbox.core.errors import MessageNotFoundError, ValidationError

PARTITION_STRIDE = 1_000_000_000
_DLT_HEADERS = frozenset(
    (
        c.DLT_REASON,
        c.DLT_ERROR,
        c.DLT_TOPIC,
        c.DLT_PARTITION,
        c.DLT_OFFSET,
        c.DLT_TRIES,
        c.DLT_GROUP,
    )
)


class KafkaDeadLetters:
    """The dead letters of one dead-letter topic."""

    def __init__(self, config: KafkaConfig, topic: str) -> None:
        problem = mapping.topic_problem(topic)
        if problem:
            raise ValidationError(f"--kafka-topic {topic!r} {problem}")
        self.config = config
        self.topic = topic
        self._letters: list[tuple[DeadLetter, Any]] | None = None

    def _read(self) -> list[tuple[DeadLetter, Any]]:
        """The topic as it was at the first call: one CLI command reads it once (``requeue 3``
        looks the id up, counts and requeues on the same snapshot)."""
        if self._letters is None:
            self._letters = [(self._letter(r), r) for r in read_records(self.config, self.topic)]
        return self._letters

    def page(
        self, before: int | None = None, limit: int = 50
    ) -> tuple[list[DeadLetter], int, bool]:
        """(the ``limit`` dead letters with the highest ids below ``before``, newest first; how
        many the topic holds, by its offsets; whether older ones are left). Reads only those
        records: the last ``limit`` offsets of each partition it needs (the console's pages: a
        topic of 100,000 records is not read for 50)."""
        marks = watermarks(self.config, self.topic)
        total = sum(high - low for low, high in marks.values())
        ranges: dict[int, tuple[int, int]] = {}
        for p, (low, high) in marks.items():
            end = high
            if before is not None:
                below, at = divmod(before - 1, PARTITION_STRIDE)  # ids below: offsets below ``at``
                if p > below:
                    continue
                end = min(high, at) if p == below else high
            if end > low:
                ranges[p] = (max(low, end - limit), end)
        letters = sorted(
            (self._letter(r) for r in read_ranges(self.config, self.topic, ranges)),
            key=lambda d: d.id,
            reverse=True,
        )[:limit]
        kept = [p * PARTITION_STRIDE + low + 1 for p, (low, high) in marks.items() if high > low]
        older = bool(letters) and letters[-1].id > min(kept)
        return letters, total, older

    def by_ids(self, ids: Sequence[int]) -> list[DeadLetter]:
        """The dead letters of ``ids`` (those the topic still holds), read by their offsets."""
        return [d for d, _ in self._by_ids(ids)]

    def _by_ids(self, ids: Sequence[int]) -> list[tuple[DeadLetter, Any]]:
        """Each partition read from the lowest offset ``ids`` name to the highest (a selection
        spans a page or a few: not the whole topic)."""
        wanted = set(ids)
        if self._letters is not None:
            return [(d, r) for d, r in self._letters if d.id in wanted]
        spans: dict[int, tuple[int, int]] = {}
        for i in ids:
            p, offset = divmod(i - 1, PARTITION_STRIDE)
            lo, hi = spans.get(p, (offset, offset + 1))
            spans[p] = (min(lo, offset), max(hi, offset + 1))
        marks = watermarks(self.config, self.topic)  # an id past the end is not waited for
        spans = {
            p: (max(lo, marks[p][0]), min(hi, marks[p][1])) for p, (lo, hi) in spans.items()
            if p in marks
        }  # fmt: skip
        read = read_ranges(self.config, self.topic, spans)
        return [(d, r) for d, r in ((self._letter(r), r) for r in read) if d.id in wanted]

    def _letter(self, r: Any) -> DeadLetter:
        m = mapping.record_of(r)
        dlt = {k: v for k, v in m.headers.items() if k in _DLT_HEADERS}
        own = {k: v for k, v in m.headers.items() if k not in _DLT_HEADERS}
        _kind, ms = r.timestamp()
        at = datetime.fromtimestamp(ms / 1000, UTC) if ms and ms > 0 else datetime.now(UTC)
        return DeadLetter(
            id=r.partition() * PARTITION_STRIDE + r.offset() + 1,
            queue=dlt.get(c.DLT_TOPIC, ""),
            message_id=m.message_id,
            session_id=m.session_id,
            body=m.body,
            subject=m.subject,
            content_type=m.content_type,
            correlation_id=m.correlation_id,
            headers=own,
            enqueued_at=at,
            sequence_number=int(dlt.get(c.DLT_OFFSET, "0") or 0),
            delivery_count=int(dlt.get(c.DLT_TRIES, "0") or 0),
            reason=dlt.get(c.DLT_REASON, ""),
            description=dlt.get(c.DLT_ERROR, ""),
            dead_lettered_at=at,
        )

    def _select(
        self, ids: Sequence[int] | None, where: Mapping[str, str] | None, everything: bool
    ) -> list[tuple[DeadLetter, Any]]:
        selection = DeadLetterSelection.of(ids, where=where, all=everything)
        chosen = self._by_ids(ids) if ids and not where and not everything else self._read()
        return [(d, r) for d, r in chosen if selection.matches(d)]

    # --- what the CLI calls ------------------------------------------------------------------

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        selection = DeadLetterSelection.of(where=where) if where else DeadLetterSelection(all=True)
        letters = [
            d
            for d, _ in self._read()
            if (queue is None or d.queue == queue) and selection.matches(d)
        ]
        return letters[:limit]

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        for d in self.by_ids([dead_letter_id]):
            return d
        raise MessageNotFoundError(
            f"no dead letter {dead_letter_id} in Kafka topic {self.topic!r}",
            hint=f"outbox dead-letters --kafka-topic {self.topic} list shows the ids",
        )

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        return len(self._select(ids, where, all))

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Produce each selected record again to the topic it came from, with its own key,
        message id and headers (the dead-letter headers dropped)."""
        chosen = self._select(ids, where, all)
        batch = []
        for d, r in chosen:
            if not d.queue:
                raise ValidationError(
                    f"dead letter {d.id} has no {c.DLT_TOPIC} header: it was not written by the "
                    "consumer helper, so where it came from is unknown"
                )
            m = mapping.record_of(r)
            m.destination = d.queue
            m.headers = dict(d.headers)
            batch.append(m)
        if batch:
            transport = KafkaTransport(self.config)
            try:
                transport.send(batch)
            finally:
                transport.close()
        if on_progress is not None:
            on_progress(len(batch))
        return len(batch)

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        raise ValidationError(
            f"Kafka cannot delete records from the dead-letter topic {self.topic!r}: they leave "
            "when its retention ends",
            hint=f"set retention.ms on {self.topic}, or delete and recreate the topic",
        )

    def close(self) -> None:
        pass

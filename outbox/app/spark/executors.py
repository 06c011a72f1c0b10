"""Dispatch after a Spark commit from the executors: each partition sends its messages itself.

Why: on the driver, every message of a batch is collected to one Python process and sent from
there (``outbox.app.spark.dispatch``), which is the bottleneck of a large batch. Here the commit's
change data stays on the executors: its pending messages are exploded, repartitioned by
(destination, ordering key) so a key's messages meet in one partition, sorted there by when they
were written (then document and seq), and each partition builds the settings' transport and
sends them in batches of up to 1,000 (Kafka: one idempotent producer per partition; the SQL queue
on PostgreSQL: one transaction per batch). Only a small outcome per document comes back (the
first seq that failed, if any); the driver then advances the watermarks in one append and
enqueues a retry command for each document left pending. Nothing is sent before its commit: the
partitions read the commit's change feed, which exists only once the MERGE committed.

Per key, a partition stops at the first message it could not send (the key's later messages
count as failed too), as the Python dispatcher pauses a key; a document's watermark only covers
messages below its first failure. A failed executor task is run again by Spark and sends its
messages again, with the same ids (repeats, which inboxes drop); a killed driver leaves the
watermarks unwritten, and the rescuer re-sends (docs/spark.md).

SQLite stays on the driver (``SparkOutbox(send_from="driver")``, chosen automatically): its one
writer at a time would only queue the executors.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from dispatcher.dispatch import DispatchReport, DocumentOutcome
from dispatcher.hooks import NO_HOOK, StepHook
from outbox.core.errors import RetryableTransportError, ValidationError
from outbox.core.settings import Settings

log = logging.getLogger("outbox.app.spark")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Records per send from one partition (the dispatcher's own cap).
BATCH = 1000
#: An outcome's columns: document, life, its watermark before, its newest seq, first failure.
OUTCOME_SCHEMA = (
    "id string, incarnation string, start bigint, last_seq bigint, failed_seq bigint, "
    "sent bigint, error string"
)


SendFrom = Literal["auto", "driver", "executors"]

#: Builds a partition's step hook on the executor (``SparkOutbox.executor_hook``). It travels
#: there pickled, so it is a picklable callable: production passes none (``NO_HOOK``); the fault
#: proofs pass the testing kit's ``outbox.testing.crash_points.CrashSpec``, so nothing here
#: imports the kit.
HookFactory = Callable[[], StepHook]


def choose(send_from: SendFrom, transport: object, settings: Settings) -> SendFrom:
    """Where a ``SparkOutbox`` sends from: ``auto`` is the executors for the transports whose
    client runs there (``outbox.wiring``: Kafka, Service Bus, the SQL queue on a server
    database), when the transport comes from the settings (a ``Transport``
    object cannot travel to the executors), else the driver."""
    if send_from not in ("auto", "driver", "executors"):
        raise ValidationError(f"send_from {send_from!r}; use auto, driver or executors")
    if send_from == "executors" and transport is not None:
        raise ValidationError(
            "send_from='executors' builds the transport from the settings on each executor; "
            "a Transport object cannot travel there",
            hint="name the transport in the settings, or use send_from='driver'",
        )
    if send_from != "auto":
        return send_from
    from outbox.wiring.builtin import sends_from_executors

    return "executors" if transport is None and sends_from_executors(settings) else "driver"


#: A pending message as the partitions read it (the columns ``send_partition`` takes).
_FIELDS = (
    "m.seq AS seq",
    "m.message_id AS message_id",
    "m.destination AS destination",
    "m.type AS type",
    "m.body AS body",
    "m.content_type AS content_type",
    "m.headers AS headers",
    "coalesce(m.ordering_key, id) AS key",
    "m.correlation_id AS correlation_id",
    "unix_micros(m.deliver_at) AS deliver_at",
    "unix_micros(m.created_at) AS created_at",
)
_STRUCT = (
    "transform(filter(outbox, m -> m.seq > dispatched_seq), m -> named_struct("
    "'seq', m.seq, 'message_id', m.message_id, 'destination', m.destination, 'type', m.type, "
    "'body', m.body, 'content_type', m.content_type, 'headers', m.headers, "
    "'key', coalesce(m.ordering_key, id), 'correlation_id', m.correlation_id, "
    "'deliver_at', unix_micros(m.deliver_at), 'created_at', unix_micros(m.created_at)))"
)
_DOC = ("id", "incarnation", "dispatched_seq AS start", "last_seq")


def _pending(written: Any) -> Any:
    from pyspark.sql import functions as F

    return written.filter(F.col("last_seq") > F.col("dispatched_seq"))


def message_frame(written: Any) -> Any:
    """One row per pending message of a commit frame, with its key and the document's watermark."""
    exploded = _pending(written).selectExpr(
        *_DOC, "explode(filter(outbox, m -> m.seq > dispatched_seq)) AS m"
    )
    return exploded.selectExpr("id", "incarnation", "start", "last_seq", *_FIELDS)


def send_on_executors(
    written: Any,
    settings: Settings,
    partitions: int,
    *,
    hook: HookFactory | None = None,
    paused: frozenset[tuple[str, str]] = frozenset(),
) -> list[Any]:
    """Send a commit's pending messages from the executors; the outcome rows, one per
    document (``OUTCOME_SCHEMA``), collected to the driver as Arrow. ``hook``: builds each
    partition's step hook (the fault proofs; point ``executor_sent``). ``paused``: the
    ordering keys paused when the job started (read by the driver from the shared lines); their
    messages are not sent here, and their documents get retry commands like a failed send, so a
    key held in another process stays in its line.

    Without shared ordering keys (each message keyed by its document, the default; the Spark
    path stores the document id as the key), a
    document's row is sent where it lies: its messages are in it, in seq order, and no other
    document shares its key, so nothing moves between executors. With shared keys, the messages
    are exploded and repartitioned by (destination, key) first, so a key's messages meet in one
    partition, sorted by when they were written."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    docs = (
        _pending(written)
        .selectExpr(*_DOC, f"{_STRUCT} AS msgs")
        .selectExpr("*", "exists(msgs, m -> m.key != id) AS shared")
        .persist(StorageLevel.MEMORY_AND_DISK)  # read once: for the check, then for the sends
    )
    try:
        if not docs.filter("shared").limit(1).count():
            sends = docs.drop("shared").mapInArrow(
                _arrow(settings, per_document=True, hook=hook, paused=paused), OUTCOME_SCHEMA
            )
            return list(sends.toArrow().to_pylist())
    finally:
        docs.unpersist()
    ordered = message_frame(written).repartition(partitions, "destination", "key")
    ordered = ordered.sortWithinPartitions("destination", "key", "created_at", "id", "seq")
    outcomes = ordered.mapInArrow(
        _arrow(settings, per_document=False, hook=hook, paused=paused), OUTCOME_SCHEMA
    )
    per_doc = outcomes.groupBy("id", "incarnation").agg(
        F.min("start").alias("start"),
        F.max("last_seq").alias("last_seq"),
        F.min("failed_seq").alias("failed_seq"),
        F.sum("sent").alias("sent"),
        F.first("error", ignorenulls=True).alias("error"),
    )
    return list(per_doc.toArrow().to_pylist())


def _arrow(
    settings: Settings,
    *,
    per_document: bool,
    hook: HookFactory | None = None,
    paused: frozenset[tuple[str, str]] = frozenset(),
) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The partition function for ``mapInArrow``: Arrow in and out, so a row costs a dict
    rather than a pickled ``Row``. ``hook`` is called in the partition (this executor process
    never saw the driver's hook)."""

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        rows: Iterable[dict[str, Any]] = (r for b in batches for r in b.to_pylist())
        if per_document:
            rows = _flatten(rows)
        step_hook = NO_HOOK if hook is None else hook()
        out = list(send_partition(rows, settings, hook=step_hook, paused=paused))
        schema = pa.schema(
            [
                ("id", pa.string()),
                ("incarnation", pa.string()),
                ("start", pa.int64()),
                ("last_seq", pa.int64()),
                ("failed_seq", pa.int64()),
                ("sent", pa.int64()),
                ("error", pa.string()),
            ]
        )
        columns: list[Any] = list(zip(*out, strict=True)) if out else [() for _ in schema]
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
        )

    return run


def _flatten(docs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for d in docs:
        head = {"id": d["id"], "incarnation": d["incarnation"], "start": d["start"]}
        head["last_seq"] = d["last_seq"]
        for m in sorted(d["msgs"] or (), key=lambda m: m["seq"]):
            yield {**head, **m}


def dispatch_commit(
    sob: Any, version: int, timings: dict[str, float]
) -> tuple[DispatchReport | None, int]:
    """A ``SparkOutbox``'s immediate dispatch of commit ``version`` from the executors, then
    ``settle`` on the driver. Never raises (I4): what fails here is the rescuer's (the commit is
    durable)."""
    from outbox.app.spark.dispatch import commit_frame

    sob.runtime.crash_points.hit("after_commit")
    t0 = time.perf_counter()
    try:
        written = commit_frame(sob._reader(), sob.table_uri, version)
        partitions = sob.spark.sparkContext.defaultParallelism
        paused = frozenset(sob.runtime.dispatcher.keys.all_lines())
        outcomes = send_on_executors(
            written, sob.settings, partitions, hook=sob.executor_hook, paused=paused
        )
    except Exception:
        log.exception("sending commit %d from the executors failed; the rescuer covers it", version)
        return None, 0
    timings["executor_send_s"] = time.perf_counter() - t0
    return settle(outcomes, sob.store, sob.runtime, version, timings)


def settle(
    outcomes: list[Any], store: Any, runtime: Any, version: int, timings: dict[str, float]
) -> tuple[DispatchReport, int]:
    """On the driver, after the executors' sends: the marks of every document that made progress
    in one append, and a retry command for each one left pending (or whose mark was not
    written). Returns the report and the number of messages the commit left pending."""
    report = DispatchReport()
    marks: dict[str, int] = {}
    lives: dict[str, str | None] = {}
    retry: list[tuple[str, int, str | None]] = []
    count = 0
    for o in outcomes:
        start, last = int(o["start"]), int(o["last_seq"])
        count += last - start
        report.messages_sent += int(o["sent"] or 0)
        upto = last if o["failed_seq"] is None else int(o["failed_seq"]) - 1
        if upto > start:
            marks[o["id"]] = upto
            lives[o["id"]] = o["incarnation"]
        if o["failed_seq"] is not None:
            retry.append((o["id"], last, o["incarnation"]))
            report.outcomes[o["id"]] = DocumentOutcome(
                o["id"], start, last, max(upto, start), RetryableTransportError(o["error"])
            )
    t1 = time.perf_counter()
    try:
        report.watermark_version = store.advance_watermarks(marks, lives)
    except Exception as e:
        report.watermark_error = e
        log.warning("commit %d: watermarks not written (%s); retry commands follow", version, e)
        retry += [(d, marks[d], lives[d]) for d in marks if d not in report.outcomes]
    timings["watermark_s"] = time.perf_counter() - t1
    failed = {o["id"]: int(o["failed_seq"]) for o in outcomes if o["failed_seq"] is not None}
    if failed:
        from outbox.app.spark.dispatch import hold_unsent

        hold_unsent(failed, store, runtime, str(next(iter(report.outcomes.values())).error))
    if retry:
        log.warning(
            "commit %d: %d document(s) left pending after the executors' sends (first: %s)",
            version,
            len(retry),
            next((o.error for o in report.outcomes.values()), report.watermark_error),
        )
        runtime.enqueue_commands(retry, delay=runtime.retry_delay)
    return report, count


@dataclass(slots=True)
class _Doc:
    incarnation: str | None
    start: int
    last_seq: int
    failed_seq: int | None = None
    sent: int = 0
    error: str | None = None


def send_partition(
    rows: Iterable[Any],
    settings: Settings,
    *,
    hook: StepHook = NO_HOOK,
    paused: frozenset[tuple[str, str]] = frozenset(),
) -> Iterator[tuple[Any, ...]]:
    """One partition's sends (on an executor): keys in their order, batches of ``BATCH``;
    nothing of a key in ``paused``."""
    from dispatcher.transports.base import TransportMessage
    from outbox.wiring import Backends

    docs: dict[str, _Doc] = {}
    failed_keys: dict[tuple[str, str], str] = {}
    batch: list[tuple[Any, TransportMessage]] = []
    backends = Backends(settings)
    try:
        transport = backends.transport()

        def fail(r: Any, why: str) -> None:
            d = docs[r["id"]]
            if d.failed_seq is None or r["seq"] < d.failed_seq:
                d.failed_seq = r["seq"]
                d.error = d.error or why

        def flush() -> None:
            if not batch:
                return
            try:
                transport.send([m for _, m in batch])
            except Exception:  # one at a time, to find which keys stop where
                for r, m in batch:
                    key = (r["destination"], r["key"])
                    if key in failed_keys:
                        fail(r, failed_keys[key])
                        continue
                    try:
                        transport.send([m])
                    except Exception as e:
                        failed_keys[key] = f"{type(e).__name__}: {e}"
                        fail(r, failed_keys[key])
                    else:
                        docs[r["id"]].sent += 1
            else:
                for r, _ in batch:
                    docs[r["id"]].sent += 1
                hook.hit("executor_sent")
            batch.clear()

        for r in rows:
            if r["id"] not in docs:
                docs[r["id"]] = _Doc(r["incarnation"], int(r["start"]), int(r["last_seq"]))
            key = (r["destination"], r["key"])
            if key in paused and key not in failed_keys:
                failed_keys[key] = f"ordering key {key[0]}/{key[1]} is paused in another process"
            if key in failed_keys:  # a key stops at its first failure, as the dispatcher's
                fail(r, failed_keys[key])
                continue
            batch.append((r, _message(r, TransportMessage)))
            if len(batch) >= BATCH:
                flush()
        flush()
    finally:
        backends.close()
    for doc_id, d in docs.items():
        yield (doc_id, d.incarnation, d.start, d.last_seq, d.failed_seq, d.sent, d.error)


def _message(r: Any, cls: Any) -> Any:
    deliver = r["deliver_at"]
    return cls(
        message_id=r["message_id"],
        destination=r["destination"],
        body=r["body"].encode("utf-8"),
        subject=r["type"],
        content_type=r["content_type"] or "application/json",
        session_id=r["key"],
        scheduled_at=None if deliver is None else _EPOCH + timedelta(microseconds=int(deliver)),
        correlation_id=r["correlation_id"],
        headers=json.loads(r["headers"]) if r["headers"] else {},  # stored as JSON text
    )

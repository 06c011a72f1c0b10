"""Dispatch after a Spark commit: that commit's pending messages, from its change data only.

The committed version's change feed (``startingVersion = endingVersion = v``) holds exactly the
rows this apply wrote, as ``insert`` and ``update_postimage`` images; Delta reads only that
commit's files, never the table. An updated row carries the document's watermark as the apply
read it (``merge.merge_actions``: in the versions layout a mark row may hold a higher one than
the row's own), so its ``dispatched_seq`` is the document's as of the commit, or just below when a
mark landed meanwhile (re-sends with the same ids, never a loss). Only pending rows
(``last_seq > dispatched_seq``) and only their pending messages come back to the driver, as
``DocumentRow``s, and from there the Python path takes over unchanged:
``DispatcherRuntime.after_commit`` (immediate: the ``Dispatcher`` sends per document in seq order
with bounded concurrency, then one watermark write through the deltalake store; deferred: one
``ProcessDocument`` command per document).

This is the driver's path: SQLite's one writer (and a ``Transport`` object, which cannot travel
to the executors) send from here. Kafka, Service Bus and the SQL queue on PostgreSQL send from
the executors instead (``outbox.app.spark.executors``): collecting every message to one Python
process was the bottleneck of a large batch (benchmarks/results/spark_write.json against
spark_kafka.json).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.core.model import DocumentRow
from outbox.delta import schema as S

log = logging.getLogger("outbox.app.spark")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WRITTEN = ("insert", "update_postimage")

#: Timestamps travel as epoch microseconds: PySpark turns a timestamp into a *naive local* time.
_MICROS = (
    "m -> named_struct('seq', m.seq, 'message_id', m.message_id, 'destination', m.destination, "
    "'type', m.type, 'body', m.body, 'content_type', m.content_type, 'headers', m.headers, "
    "'ordering_key', m.ordering_key, 'correlation_id', m.correlation_id, "
    "'deliver_at', unix_micros(m.deliver_at), 'created_at', unix_micros(m.created_at))"
)


def commit_frame(reader: Any, uri: str, version: int) -> Any:
    """The rows commit ``version`` wrote (post-images and inserts)."""
    from pyspark.sql import functions as F

    return (
        reader.option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(uri)
        .filter(F.col("_change_type").isin(*WRITTEN))
    )


def pending_rows(written: Any) -> list[DocumentRow]:
    """The pending documents of a commit frame, with their pending messages only."""
    from pyspark.sql import functions as F

    rows = (
        written.filter(F.col("last_seq") > F.col("dispatched_seq"))
        .select(
            "id",
            "type",
            "version",
            "last_seq",
            "dispatched_seq",
            S.INCARNATION,
            F.expr(f"transform(filter(outbox, m -> m.seq > dispatched_seq), {_MICROS})").alias(
                "outbox"
            ),
        )
        .collect()
    )
    return [
        DocumentRow(
            id=r["id"],
            type=r["type"],
            version=int(r["version"]),
            state={},  # dispatch never reads the state; it is not brought to the driver
            last_seq=int(r["last_seq"]),
            dispatched_seq=int(r["dispatched_seq"]),
            outbox=[S.message_from_struct(_struct(m)) for m in (r["outbox"] or [])],
            incarnation=r[S.INCARNATION],
        )
        for r in rows
    ]


def _struct(m: Any) -> dict[str, Any]:
    d: dict[str, Any] = m.asDict()
    for key in ("deliver_at", "created_at"):
        micros = d.get(key)
        d[key] = None if micros is None else _EPOCH + timedelta(microseconds=int(micros))
    return d


def hold_unsent(failed: dict[str, int], store: Any, runtime: Any, reason: str) -> None:
    """Put the unsent messages of the documents the executors stopped (from their first
    failure) in their keys' shared lines, in the order they were written, as the dispatcher
    does for a document it stops: later messages of those keys, from any process, wait."""
    from dispatcher.keys import key_of
    from dispatcher.queue.key_lines import Wait

    try:
        _, rows = store.read(list(failed))
    except Exception as e:  # their retry commands still run; only the pause is not recorded
        log.warning("could not read the stopped documents to pause their keys (%s)", e)
        return
    waits = [
        (
            m.created_at or _EPOCH,
            r.id,
            m.seq,
            Wait(key_of(m, r.id), r.id, r.incarnation, m.seq, m.message_id),
        )
        for r in rows.values()
        for m in r.pending()
        if m.seq >= failed[r.id]
    ]
    waits.sort(key=lambda w: w[:3])
    runtime.dispatcher.keys.hold([w[3] for w in waits], reason)

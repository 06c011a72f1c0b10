"""The one MERGE of an ``apply``: documents, versions, seqs and messages in one Delta commit.

Everything that depends on the *current* row is computed inside the MERGE, against the target it
reads: the new messages' seqs continue ``t.last_seq``, their ids derive from ``t.incarnation`` (a
new document draws one), ``version`` becomes ``t.version + 1`` and the outbox keeps only what is
above the document's watermark (a save never brings a sent message back). ``dispatched_seq`` is
only ever raised (``greatest``), never lowered (I4); inserts start it at 0.

The versions layout (``outbox.delta.versions``): the table holds a row per document *version*
(and mark rows, ``version`` 0, that only hold a watermark), and a document is its row with the
highest ``version``. The MERGE updates that row only, in place (copy-on-write; the Python path
appends a new row instead, and the rule reads both the same); mark rows never match. It cannot
pick that row by itself (a MERGE joins rows, it cannot ask "is there a higher one"), so
``with_newest`` first reads, per source id, the newest version, its incarnation and that life's
watermark (one aggregation over the touched buckets), and the MERGE joins
``t.version >= s._newest``. The read may be stale by the time the MERGE runs: a writer may have
appended a newer version, updated the newest in place, or deleted and re-created the document.
Any of these shows in the MERGE's own snapshot as a row other than the one read (a higher
version, another life, or no row at all), and that row's clause is ``raise_error``
(``STALE_NEWEST``): the MERGE fails, commits nothing, and ``apply`` reads again and retries
(``is_stale_newest``). A writer that commits while the MERGE runs is Delta's conflict detection's
(``ConcurrentAppendException``: the MERGE read those buckets), also retried. So a superseded row is
never updated, and an insert never lands beside a row it did not see.

A tombstone (the version ``uow.delete`` writes, ``deleted`` true) is the newest row of a deleted
document. An update of it (``expected_version`` above 0) matches no clause: it is not written and
``apply`` reports it in ``conflicts``. A create (``expected_version`` 0 or null) over it starts
a new life *in place* once the tombstone's last messages are sent (its life's watermark reached
its ``last_seq``): the row becomes version + 1 with a new incarnation, so "the highest version is
the newest" holds, as after a Python create over a tombstone. Over an unsent tombstone it is a
conflict too: the new life would hide the old one's pending tail (docs/design.md, section 2).

The predicate carries a literal ``t.bucket IN (...)`` filter, like the Python store's, so this
commit does not conflict with deltalake writers on other buckets.

Idempotence: with ``txn=(app_id, version)`` the MERGE runs with the session confs
``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` set, Delta's documented mechanism for
MERGE inside ``foreachBatch``. Delta records the pair in the commit and skips a later write with a
version at or below the recorded one: a replayed micro-batch does nothing.

Which version did we commit? A per-apply token goes into the commit's ``userMetadata``
(``spark.databricks.delta.commitInfo.userMetadata``), and the recent history is searched for it.
No commit found means Delta skipped the write (a replayed transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from outbox.app.spark.ids import incarnation_sql, message_id_sql
from outbox.delta import schema as S
from outbox.delta.versions import MARK_VERSION

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
HISTORY_DEPTHS = (20, 200, 2000)
#: The message of the error a MERGE raises when a document moved since ``with_newest`` read it.
STALE_NEWEST = "OUTBOX_STALE_NEWEST: a document changed after its newest version was read"
_STALE = f"cast(raise_error('{STALE_NEWEST}') as bigint)"
#: A null incarnation, as a group key (never a real token: incarnations are hex).
_NO_LIFE = "\x00"

#: Session confs are per SparkSession, not per thread: applies on one session take turns.
_conf_lock = threading.Lock()


@contextmanager
def session_confs(spark: Any, confs: Mapping[str, str]) -> Iterator[None]:
    """Set ``confs`` on the session for the block, restoring what was there before."""
    with _conf_lock:
        before = {k: spark.conf.get(k, None) for k in confs}
        try:
            for k, v in confs.items():
                spark.conf.set(k, v)
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, v)


def _new_messages(table_id: str, base: str, incarnation: str) -> str:
    """The source's messages as outbox structs, seqs continuing ``base``.

    The ``coalesce``s only make the struct fields non-nullable, which the table's element type
    requires (Spark refuses to cast nullable into non-nullable inside an array); validation has
    already refused a null type, body or destination.
    """
    seq = f"({base} + i + 1)"
    return (
        "transform(s.messages, (m, i) -> named_struct("
        f"'seq', coalesce(cast({seq} as bigint), 0L), "
        f"'message_id', coalesce({message_id_sql(table_id, 's.id', seq, incarnation)}, ''), "
        "'destination', coalesce(m.destination, ''), "
        "'type', coalesce(m.type, ''), "
        "'body', coalesce(m.body, ''), "
        "'content_type', m.content_type, "
        "'headers', m.headers, "
        "'ordering_key', coalesce(m.ordering_key, s.id), "
        "'correlation_id', m.correlation_id, "
        "'deliver_at', m.deliver_at, "
        "'created_at', m.created_at))"
    )


def merge_actions(
    table_id: str, token: str, now_sql: str
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The SET list of the matched update, the VALUES of the insert and the SET list of a new
    life over a sent tombstone (the insert's values, in place), as SQL.

    The update carries the document's watermark as ``with_newest`` read it (``s._watermark``:
    the highest ``dispatched_seq`` over the rows of the newest row's life, mark rows included,
    so usually above this row's own) into the row, never below the row's own (``greatest``), as
    a Python save carries the one it read into its new row. So the row's outbox drops only
    messages the transport accepted, and the dispatch after the commit (``dispatch.pending_rows``,
    from this commit's rows) does not send them again. A mark that lands after the read is not
    seen: its messages stay in the array, already sent, and may be sent once more with the same
    ids (never one lost)."""
    inc = S.INCARNATION
    watermark = "greatest(t.dispatched_seq, coalesce(s._watermark, t.dispatched_seq))"
    kept = f"filter(t.outbox, m -> m.seq > {watermark})"
    update = {
        "type": "s.type",
        "version": "t.version + 1",
        "state": "coalesce(s.state, t.state)",
        "last_seq": "t.last_seq + size(s.messages)",
        "dispatched_seq": watermark,
        "outbox": f"concat({kept}, {_new_messages(table_id, 't.last_seq', f't.{inc}')})",
        "updated_at": now_sql,
        S.DELETED: "false",
    }
    new_inc = incarnation_sql(token, "s.id")
    insert = {
        "id": "s.id",
        "type": "s.type",
        "version": "1L",
        "state": "coalesce(s.state, '{}')",
        "last_seq": "cast(size(s.messages) as bigint)",
        "dispatched_seq": "0L",
        "outbox": _new_messages(table_id, "0", new_inc),
        "updated_at": now_sql,
        "bucket": "s.bucket",
        inc: new_inc,
        S.DELETED: "false",
    }
    reborn = {k: v for k, v in insert.items() if k not in ("id", "bucket")}
    return update, insert, {**reborn, "version": "t.version + 1"}


def tombstone_sent(watermark: str) -> str:
    """SQL: the matched row ``t`` is a tombstone whose last messages were sent."""
    return f"coalesce(t.{S.DELETED}, false) AND {watermark} >= t.last_seq"


def with_newest(source: Any, table: Any, buckets: list[int]) -> Any:
    """``source`` with, per id, the document's newest row as ``table`` (the current snapshot)
    holds it: ``_newest`` (its version; null when the id holds no document), ``_life`` (its
    incarnation) and ``_watermark`` (the highest ``dispatched_seq`` over that life's rows, mark
    rows included). One aggregation over the touched buckets' rows of the source's ids (control
    columns only). A mark row (``MARK_VERSION``) is never the newest row: an id with only mark
    rows (of a document deleted since) holds no document."""
    from pyspark.sql import functions as F

    life = F.coalesce(F.col(S.INCARNATION), F.lit(_NO_LIFE))
    rows = (
        table.filter(F.col("bucket").isin([int(b) for b in buckets]))
        .select("bucket", "id", "version", "dispatched_seq", S.INCARNATION)
        .join(source.select("bucket", "id"), ["bucket", "id"], "left_semi")
    )
    document = F.col("version") > F.lit(MARK_VERSION)
    per_life = rows.groupBy(F.col("id"), life.alias("_l")).agg(
        F.max(F.when(document, F.col("version"))).alias("top"),  # null: mark rows only
        F.max("dispatched_seq").alias("ds"),
        F.max(S.INCARNATION).alias("inc"),  # one value per life (null for a legacy one)
    )
    newest = per_life.groupBy("id").agg(
        F.max_by(F.struct("top", "inc", "ds"), F.col("top")).alias("n")
    )
    return source.join(
        newest.select(
            "id",
            F.col("n.top").alias("_newest"),
            F.col("n.inc").alias("_life"),
            F.col("n.ds").alias("_watermark"),
        ),
        "id",
        "left",
    )


def run_merge(
    target: Any,
    source: Any,
    *,
    table_id: str,
    buckets: list[int],
    token: str,
    now_sql: str,
) -> dict[str, int]:
    """Run the MERGE of ``source`` (from ``with_newest``; the caller sets the session confs);
    returns Delta's row metrics. Raises (``is_stale_newest``) when a document moved since
    ``source`` read its newest version: nothing is committed then."""
    in_list = ", ".join(str(int(b)) for b in buckets) or "-1"
    update, insert, reborn = merge_actions(table_id, token, now_sql)
    read = f"t.version = s._newest AND t.{S.INCARNATION} IS NOT DISTINCT FROM s._life"
    sent = tombstone_sent("greatest(t.dispatched_seq, coalesce(s._watermark, t.dispatched_seq))")
    result = (
        target.alias("t")
        .merge(
            source.alias("s"),
            f"t.bucket IN ({in_list}) AND t.bucket = s.bucket AND t.id = s.id "
            f"AND t.version > {MARK_VERSION} AND (s._newest IS NULL OR t.version >= s._newest)",
        )
        # a newer version, another life, or a row where none was: the read is stale
        .whenMatchedUpdate(condition=f"s._newest IS NULL OR NOT ({read})", set={"version": _STALE})
        # a create over a tombstone whose last messages left: a new life, in place
        .whenMatchedUpdate(condition=f"coalesce(s._expected, 0) = 0 AND {sent}", set=reborn)
        # a tombstone is updated by nothing else: such a change is a conflict
        .whenMatchedUpdate(
            condition=f"NOT coalesce(t.{S.DELETED}, false) "
            "AND (s._expected IS NULL OR t.version = s._expected)",
            set=update,
        )
        # the newest row read is gone (the document was deleted since): stale too
        .whenNotMatchedInsert(
            condition="s._newest IS NOT NULL", values={**insert, "version": _STALE}
        )
        .whenNotMatchedInsert(condition="s._expected IS NULL OR s._expected = 0", values=insert)
        .execute()
    )
    if result is None:  # pragma: no cover - older delta-spark returned nothing
        return {}
    row = result.first()
    return {k: int(v) for k, v in row.asDict().items()} if row is not None else {}


def is_stale_newest(e: BaseException) -> bool:
    """Did the MERGE fail because a document moved after ``with_newest`` read it?"""
    return STALE_NEWEST in str(e)


def find_commit(target: Any, token: str) -> int | None:
    """The version whose ``userMetadata`` is ``token``; None when no such commit exists."""
    from pyspark.sql import functions as F

    for depth in HISTORY_DEPTHS:
        hist = target.history(depth).select("version", "userMetadata")
        found = hist.filter(F.col("userMetadata") == token).select("version").first()
        if found is not None:
            return int(found["version"])
        if hist.count() < depth:
            return None
    return None

"""The one MERGE of an ``apply``: documents, versions, seqs and messages in one Delta commit.

Everything that depends on the *current* row is computed inside the MERGE, against the target it
reads, so there is no read-then-write race: the new messages' seqs continue ``t.last_seq``, their
ids derive from ``t.incarnation`` (a new document draws one), ``version`` becomes ``t.version + 1``
and the outbox keeps only what is above ``t.dispatched_seq`` (a save never brings a sent message
back). ``dispatched_seq`` is never in the update's SET list (I4); inserts start it at 0.

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

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
HISTORY_DEPTHS = (20, 200, 2000)

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


def merge_actions(table_id: str, token: str, now_sql: str) -> tuple[dict[str, str], dict[str, str]]:
    """The SET list of the matched update and the VALUES of the insert, as SQL."""
    inc = S.INCARNATION
    kept = "filter(t.outbox, m -> m.seq > t.dispatched_seq)"
    update = {
        "type": "s.type",
        "version": "t.version + 1",
        "state": "coalesce(s.state, t.state)",
        "last_seq": "t.last_seq + size(s.messages)",
        "outbox": f"concat({kept}, {_new_messages(table_id, 't.last_seq', f't.{inc}')})",
        "updated_at": now_sql,
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
    }
    return update, insert


def run_merge(
    target: Any,
    source: Any,
    *,
    table_id: str,
    buckets: list[int],
    token: str,
    now_sql: str,
) -> dict[str, int]:
    """Run the MERGE (the caller sets the session confs); returns Delta's row metrics."""
    in_list = ", ".join(str(int(b)) for b in buckets) or "-1"
    update, insert = merge_actions(table_id, token, now_sql)
    result = (
        target.alias("t")
        .merge(
            source.alias("s"),
            f"t.bucket IN ({in_list}) AND t.bucket = s.bucket AND t.id = s.id",
        )
        .whenMatchedUpdate(condition="s._expected IS NULL OR t.version = s._expected", set=update)
        .whenNotMatchedInsert(condition="s._expected IS NULL OR s._expected = 0", values=insert)
        .execute()
    )
    if result is None:  # pragma: no cover - older delta-spark returned nothing
        return {}
    row = result.first()
    return {k: int(v) for k, v in row.asDict().items()} if row is not None else {}


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

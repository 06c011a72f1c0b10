"""Folding: removing the superseded versions the versions layout leaves behind.

A save appends a document's new version and a watermark a mark row (``outbox.delta.versions``);
the rows of older versions and the mark rows stay until a fold deletes them. Why a fold at all:
without it, every update and every mark would grow the table by a row for good, and reads would
fold ever more rows. Why not fold at each save: deleting the old row is exactly the
copy-on-write rewrite of its (large) file that the layout avoids.

So the upkeep folds a bucket once enough of it is superseded (``FOLD_AT``, a fifth of its rows):
one MERGE per bucket deletes the superseded rows and raises each kept row's ``dispatched_seq`` to
the highest of its life's rows first, so the document reads the same before and after (the
fold's whole contract: no document changes, only rows go). Amortised, every updated row costs
``1 / FOLD_AT`` rows rewritten by a fold: the write amplification an LSM tree trades for flat
commits (docs/delta.md, "The versions layout").

The fold's change rows are ``delete`` rows of superseded versions and post-images of kept rows
whose watermark it raised; the rescuer's planners read a delete as the end of a document only
when it removes the document's newest version (``rescuer.planner``), so a fold never hides a
pending document.

A tombstone (``uow.delete``'s last version, ``deleted``) is the end of a document, and once its
last messages are sent (its life's watermark reached its ``last_seq``) nothing needs its rows: the
fold removes every row of the id, the tombstone included, and counts them in the share that makes
a bucket due. An undispatched tombstone stays, with its life's rows, until the dispatcher or the
rescuer has sent its messages: removing it would end a document with messages pending (a loss).
Saves are appends, which never make a fold fail; a save that was about to
commit when a fold landed retries on the new snapshot (it removed data). A fold that conflicts
with another writer (another fold, a Spark MERGE) is skipped: the next upkeep tries again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.delta import schema as S
from outbox.delta.appends import OPERATION_KEY
from outbox.delta.reads import in_list
from outbox.delta.store import DeltaDocumentStore
from outbox.delta.table import store_error
from outbox.delta.versions import MARK_VERSION

log = logging.getLogger("outbox.maintain")

#: Fold a bucket once this share of its rows are superseded versions.
FOLD_AT = 0.2


@dataclass
class FoldReport:
    """What a fold did: per bucket folded, the rows it removed and the watermarks it raised."""

    buckets: list[int] = field(default_factory=list)
    rows_removed: int = 0
    watermarks_raised: int = 0
    skipped: list[int] = field(default_factory=list)  # buckets a concurrent writer held

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "rows_removed": self.rows_removed,
            "watermarks_raised": self.watermarks_raised,
            "skipped": self.skipped,
        }


def superseded_share(query: Any) -> dict[int, tuple[int, int]]:
    """Per bucket: (rows, documents kept), through ``query`` (SQL over the table ``t``). A fold
    keeps one row per document; every other row (superseded versions, mark rows, the rows of a
    dispatched tombstone) goes. A tombstone counts as sent when the highest watermark of its id
    reaches its id's highest ``last_seq``: exact for one life, an estimate across lives (only
    when the bucket is due; ``fold_source`` decides on each life's own watermark)."""
    counts = query(
        "SELECT bucket, sum(n) AS n, sum(CASE WHEN stays THEN 1 ELSE 0 END) AS ids FROM ("
        "SELECT bucket, id, count(*) AS n, "
        f"max(version) > {MARK_VERSION} AND NOT (coalesce("
        f"max(CASE WHEN {S.DELETED} THEN version END) = max(version), false) "
        "AND max(dispatched_seq) >= max(last_seq)) AS stays "
        "FROM t GROUP BY bucket, id) AS g GROUP BY bucket"
    )
    return {
        int(b): (int(n), int(i))
        for b, n, i in zip(
            counts["bucket"].to_pylist(),
            counts["n"].to_pylist(),
            counts["ids"].to_pylist(),
            strict=True,
        )
    }


def due(counts: dict[int, tuple[int, int]], *, at: float = FOLD_AT) -> list[int]:
    """The buckets whose share of rows to fold reached ``at`` (every bucket with any, at 0)."""
    return sorted(b for b, (n, ids) in counts.items() if n > ids and (n - ids) >= at * n)


def fold_source(rows: pa.Table, bucket: int) -> pa.Table:
    """The fold MERGE's source for one bucket's control rows (id, version, last_seq,
    dispatched_seq, incarnation, deleted): each superseded row to delete, and each kept row
    whose watermark is below its life's highest, to raise. Empty when the bucket has nothing to
    fold."""
    life = pc.fill_null(pc.cast(rows[S.INCARNATION], pa.string()), "\x00")
    keyed = rows.append_column("_life", life)
    newest = keyed.group_by(["id"], use_threads=False).aggregate([("version", "max")])
    highest = keyed.group_by(["id", "_life"], use_threads=False).aggregate(
        [("dispatched_seq", "max")]
    )
    joined = keyed.join(newest, keys="id").join(highest, keys=["id", "_life"])
    newest_row = pc.and_(
        pc.equal(joined["version"], joined["version_max"]),
        pc.greater(joined["version_max"], MARK_VERSION),
    )
    # The newest version stays; superseded versions and mark rows go (an id whose rows are all
    # mark rows, of a document deleted since, loses them all), and so does every row of an id
    # whose newest row is a tombstone its life's watermark has passed (its last messages left).
    kept = pc.and_(
        newest_row, pc.invert(pc.is_in(joined["id"], value_set=_sent_tombstones(joined)))
    )
    delete = pc.invert(kept)
    raise_ = pc.and_(kept, pc.less(joined["dispatched_seq"], joined["dispatched_seq_max"]))
    chosen = pc.or_(delete, raise_)
    wanted = joined.filter(chosen)
    if wanted.num_rows == 0:
        return pa.table({"id": pa.array([], pa.string())})
    source = pa.table(
        {
            "id": pc.cast(wanted["id"], pa.string()),
            "bucket": pa.array([bucket] * wanted.num_rows, pa.int32()),
            "version": pc.cast(wanted["version"], pa.int64()),
            "_fold": pc.if_else(pc.filter(kept, chosen), "raise", "delete"),
            "_ds": pc.cast(wanted["dispatched_seq_max"], pa.int64()),
        }
    )
    # One source row per (id, version): a document's mark rows all have version 0, and a MERGE
    # fails when a target row matches two source rows (one row deletes them all).
    unique = source.group_by(["id", "bucket", "version", "_fold"], use_threads=False).aggregate(
        [("_ds", "max")]
    )
    return pa.table(
        {name: unique[name] for name in ("id", "bucket", "version", "_fold")}
    ).append_column("_ds", unique["_ds_max"])


def _sent_tombstones(joined: pa.Table) -> pa.Array:
    """The ids of ``joined`` whose newest row is a tombstone whose life's watermark
    (``dispatched_seq_max``) reached its ``last_seq``."""
    if S.DELETED not in joined.column_names:
        return pa.array([], pa.string())
    top = joined.filter(
        pc.and_(
            pc.equal(joined["version"], joined["version_max"]),
            pc.fill_null(joined[S.DELETED], False),
        )
    )
    sent = top.filter(pc.greater_equal(top["dispatched_seq_max"], top["last_seq"]))
    return pc.unique(pc.cast(sent["id"], pa.string()))


def fold_merge(dt: Any, source: pa.Table, bucket: int, commit_properties: Any) -> tuple[int, int]:
    """One MERGE folding a bucket: (rows deleted, watermarks raised)."""
    metrics = (
        dt.merge(
            source,
            predicate=f"t.bucket IN ({in_list([bucket])}) AND t.bucket = s.bucket "
            "AND t.id = s.id AND t.version = s.version",
            source_alias="s",
            target_alias="t",
            streamed_exec=False,
            commit_properties=commit_properties,
        )
        .when_matched_update(
            updates={"dispatched_seq": "greatest(t.dispatched_seq, s._ds)"},
            predicate="s._fold = 'raise'",
        )
        .when_matched_delete(predicate="s._fold = 'delete'")
        .execute()
    )
    return int(metrics.get("num_target_rows_deleted", 0)), int(
        metrics.get("num_target_rows_updated", 0)
    )


def fold_table(store: DeltaDocumentStore, *, at: float = FOLD_AT) -> FoldReport:
    """Fold every bucket of ``store``'s table whose superseded share reached ``at``, one MERGE
    per bucket (so a conflict only skips that bucket). Never raises for a conflict."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    report = FoldReport()
    with store._lock:
        store.refresh()
        for b in due(superseded_share(store._query), at=at):
            rows = store._query(
                f"SELECT id, version, last_seq, dispatched_seq, {S.INCARNATION}, {S.DELETED} "
                f"FROM t WHERE bucket = {b}"
            )
            source = fold_source(rows, b)
            if source.num_rows == 0:
                continue
            props = CommitProperties(custom_metadata={OPERATION_KEY: "fold"})
            try:
                removed, raised = fold_merge(store.delta_table, source, b, props)
            except Exception as e:
                if not isinstance(e, CommitFailedError) and "concurrent" not in str(e).lower():
                    raise store_error(f"folding {store.uri} failed", e) from e
                log.info("fold of bucket %d skipped: a writer committed meanwhile (%s)", b, e)
                report.skipped.append(b)
                store.refresh()
                continue
            report.buckets.append(b)
            report.rows_removed += removed
            report.watermarks_raised += raised
            store.refresh()
    if report.buckets:
        log.info(
            "folded %d bucket(s): %d superseded row(s) removed, %d watermark(s) raised",
            len(report.buckets),
            report.rows_removed,
            report.watermarks_raised,
        )
    return report

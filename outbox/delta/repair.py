"""Finding and repairing a table whose rows exist twice (two compactions of one version).

Why: deltalake 1.6.6 commits two concurrent compactions of one snapshot, and every row they both
rewrote then exists twice (docs/delta.md, "Two concurrent compactions"). The maintenance lease
(``outbox.app.lease``) keeps a second compactor out, but a table damaged before it, or by a
compactor outside the product, stays damaged until repaired. In the versions layout such a
table still reads right (the copies are equal and the reading rule takes one of them), but every
later fold keeps both copies, external readers count documents twice, and a Spark MERGE updates
both; so ``outbox maintain`` looks for copies each run, saves refuse to build on a copied
document (``DuplicateRowsError``), and ``outbox maintain --repair`` rewrites each damaged bucket
once, keeping one row per (id, version).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.delta.appends import OPERATION_KEY
from outbox.delta.store import DeltaDocumentStore
from outbox.delta.table import store_error
from outbox.delta.versions import MARK_VERSION

log = logging.getLogger("outbox.maintain")

#: Damaged (id, version) pairs reported at most (the count is always whole).
SHOWN = 10


@dataclass
class DuplicateReport:
    """Document rows that exist more than once: how many pairs, in which buckets, a few of them."""

    pairs: int = 0
    buckets: list[int] = field(default_factory=list)
    examples: list[tuple[str, int]] = field(default_factory=list)
    repaired_buckets: list[int] = field(default_factory=list)
    rows_removed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "duplicated_versions": self.pairs,
            "buckets": self.buckets,
            "examples": [{"id": i, "version": v} for i, v in self.examples],
            "repaired_buckets": self.repaired_buckets,
            "rows_removed": self.rows_removed,
        }


def find_duplicates(store: DeltaDocumentStore) -> DuplicateReport:
    """Every (id, version) of a document held by more than one row (one scan of three columns)."""
    with store._lock:
        store.refresh()
        found = store._query(
            "SELECT bucket, id, version, count(*) AS n FROM t "
            f"WHERE version > {MARK_VERSION} GROUP BY bucket, id, version HAVING count(*) > 1 "
            "ORDER BY bucket, id, version"
        )
    rows = found.to_pylist()
    return DuplicateReport(
        pairs=len(rows),
        buckets=sorted({int(r["bucket"]) for r in rows}),
        examples=[(str(r["id"]), int(r["version"])) for r in rows[:SHOWN]],
    )


def deduplicated(rows: pa.Table) -> pa.Table:
    """One row per (id, version) of a document (the one with the highest ``dispatched_seq`` when
    the copies differ), mark rows untouched. Row order otherwise kept."""
    is_doc = pc.greater(rows["version"], MARK_VERSION)
    docs = rows.filter(is_doc)
    if docs.num_rows == 0:
        return rows
    order = pc.sort_indices(
        docs,
        sort_keys=[("id", "ascending"), ("version", "ascending"), ("dispatched_seq", "descending")],
    )
    ids = docs["id"].take(order).to_pylist()
    versions = docs["version"].take(order).to_pylist()
    keep = [
        int(order[n].as_py())
        for n in range(len(ids))
        if n == 0 or (ids[n], versions[n]) != (ids[n - 1], versions[n - 1])
    ]
    kept = docs.take(pa.array(sorted(keep), pa.int64()))
    return pa.concat_tables([kept, rows.filter(pc.invert(is_doc))])


def repair(store: DeltaDocumentStore, report: DuplicateReport) -> DuplicateReport:
    """Rewrite each damaged bucket once with one row per (id, version): a replace of the bucket
    (``mode="overwrite"`` with a ``bucket = b`` predicate), which fails rather than lose a save
    that landed in the bucket meanwhile (the next run repairs it). Run under the maintenance
    lease: a repair racing a compaction could damage the bucket again."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    with store._lock:
        for b in report.buckets:
            store.refresh()
            rows = store._query(f"SELECT * FROM t WHERE bucket = {int(b)}")
            fixed = deduplicated(rows)
            schema = pa.schema(store.delta_table.schema().to_arrow())
            try:
                write_deltalake(
                    store.delta_table,
                    fixed.select(schema.names).cast(schema),
                    mode="overwrite",
                    predicate=f"bucket = {int(b)}",
                    commit_properties=CommitProperties(custom_metadata={OPERATION_KEY: "repair"}),
                )
            except CommitFailedError as e:
                log.warning("repair of bucket %d skipped: a writer committed meanwhile (%s)", b, e)
                continue
            except Exception as e:
                raise store_error(f"repairing bucket {b} of {store.uri} failed", e) from e
            report.repaired_buckets.append(int(b))
            report.rows_removed += rows.num_rows - fixed.num_rows
        store.refresh()
    if report.repaired_buckets:
        log.info(
            "repaired %d bucket(s): %d duplicated row(s) removed",
            len(report.repaired_buckets),
            report.rows_removed,
        )
    return report

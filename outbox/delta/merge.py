"""The two MERGE statements the store commits: the save (documents, plus the watermarks it
carries) and the watermark advance.

Why its own module: the predicates *are* the write path's guarantees (docs/delta.md), so they are
read, reviewed and mutation-tested (tests/test_mutations.py) in one place, apart from the locking
and retrying around them (``outbox.delta.store``). Each function runs one MERGE on the handle it is
given and returns delta-rs's row counts; it neither refreshes nor retries.

* Every MERGE carries a *literal* ``t.bucket IN (...)`` filter: delta-rs fails one of any two
  overlapping MERGEs on an unpartitioned table; with bucket partitions and a literal filter,
  writers on different buckets commit side by side.
* A save never writes a saved document's ``dispatched_seq``; only watermarks do, with
  ``greatest(...)`` and no version check, so the dispatcher never fails an application's save
  (invariant I4).
* ``incarnation`` is written by the insert branch only. An update requires the incarnation it
  read, and a watermark the life it names (``IS NOT DISTINCT FROM``, so a legacy null matches a
  null): a document deleted and re-created since restarts at version 1 and seq 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from outbox.delta import schema as S
from outbox.delta.group_commit import DocumentWrite
from outbox.delta.reads import in_list


def save_merge(
    dt: Any,
    writes: Sequence[DocumentWrite],
    bucket: Callable[[str], int],
    carried: Mapping[str, tuple[int, str | None]] | None,
) -> tuple[int, int]:
    """One MERGE: update rows still at their expected version, insert new ones, and raise the
    ``carried`` watermarks (id -> (seq, incarnation)) of other documents. (inserted, updated)."""
    source = S.table_from_rows(
        ((w.row, bucket(w.row.id)) for w in writes),
        states=[w.state_json for w in writes],
        extra={
            "_expected": (pa.int64(), [w.expected_version for w in writes]),
            "_mark": (pa.int64(), [None] * len(writes)),
        },
    )
    bucket_ids = [bucket(w.row.id) for w in writes]
    if carried is not None:
        ids = list(carried)
        bucket_ids += [bucket(i) for i in ids]
        nullable = pa.schema([f.with_nullable(True) for f in source.schema])
        marks = mark_rows(nullable, carried, ids, [bucket(i) for i in ids])
        source = pa.concat_tables([source.cast(nullable), marks])
    buckets = in_list(bucket_ids)
    merger = dt.merge(
        source,
        predicate=f"t.bucket IN ({buckets}) AND t.bucket = s.bucket AND t.id = s.id",
        source_alias="s",
        target_alias="t",
        streamed_exec=False,
    ).when_matched_update(
        updates={
            "type": "s.type",
            "version": "s.version",
            "state": "s.state",
            "last_seq": "s.last_seq",
            "outbox": "s.outbox",
            "updated_at": "s.updated_at",
        },
        predicate="s._mark IS NULL AND t.version = s._expected "
        f"AND t.{S.INCARNATION} IS NOT DISTINCT FROM s.{S.INCARNATION}",
    )
    if carried is not None:
        merger = merger.when_matched_update(
            updates={"dispatched_seq": "greatest(t.dispatched_seq, s._mark)"},
            predicate="s._mark IS NOT NULL AND t.dispatched_seq < s._mark "
            f"AND t.{S.INCARNATION} IS NOT DISTINCT FROM s.{S.INCARNATION}",
        )
    metrics = merger.when_not_matched_insert(
        updates={f.name: f"s.{f.name}" for f in S.DOCUMENT_SCHEMA},
        predicate="s._mark IS NULL AND s._expected = 0",
    ).execute()
    return int(metrics.get("num_target_rows_inserted", 0)), int(
        metrics.get("num_target_rows_updated", 0)
    )


def documents_written(
    writes: Sequence[DocumentWrite], counts: tuple[int, int], carried_marks: int
) -> int:
    """The documents a save MERGE that also carried ``carried_marks`` watermarks wrote, from its
    (inserted, updated) counts: the marks' updates count too, so bound the documents'."""
    inserted, updated = counts
    doc_updates = len(writes) - inserted
    consistent = updated - carried_marks <= doc_updates <= updated
    written = len(writes) if consistent else inserted + updated
    if len(writes) == 1 and writes[0].expected_version == 0:
        written = inserted  # a create only ever inserts
    return written


def mark_rows(
    schema: pa.Schema,
    marks: Mapping[str, tuple[int, str | None]],
    ids: list[str],
    buckets: list[int],
) -> pa.Table:
    """Source rows that only raise watermarks: id, bucket, incarnation and ``_mark``; the
    document columns are null (no clause reads them for these rows)."""
    columns: dict[str, pa.Array] = {}
    for f in schema:
        if f.name == "id":
            columns[f.name] = pa.array(ids, f.type)
        elif f.name == "bucket":
            columns[f.name] = pa.array(buckets, f.type)
        elif f.name == S.INCARNATION:
            columns[f.name] = pa.array([marks[i][1] for i in ids], f.type)
        elif f.name == "_mark":
            columns[f.name] = pa.array([marks[i][0] for i in ids], f.type)
        elif f.name == "_expected":
            columns[f.name] = pa.array([-1] * len(ids), f.type)
        else:
            columns[f.name] = pa.nulls(len(ids), f.type)
    return pa.table(columns, schema=schema)


def watermark_source(
    marks: Mapping[str, tuple[int, bool, str | None]], bucket: Callable[[str], int]
) -> tuple[pa.Table, str]:
    """The source rows of a watermark MERGE (id -> (seq, incarnation checked, incarnation)) and
    their literal bucket list; built once, merged on every attempt."""
    ids = list(marks)
    source = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "bucket": pa.array([bucket(i) for i in ids], pa.int32()),
            "dispatched_seq": pa.array([marks[i][0] for i in ids], pa.int64()),
            "_checked": pa.array([marks[i][1] for i in ids], pa.bool_()),
            "_life": pa.array([marks[i][2] for i in ids], pa.string()),
        }
    )
    return source, in_list(bucket(i) for i in ids)


def watermark_merge(dt: Any, source: pa.Table, buckets: str) -> int:
    """One MERGE raising ``dispatched_seq`` to at least the source's (``greatest``, no version
    check); a checked row only on the life it names. The rows it updated."""
    metrics = (
        dt.merge(
            source,
            predicate=f"t.bucket IN ({buckets}) AND t.bucket = s.bucket AND t.id = s.id",
            source_alias="s",
            target_alias="t",
            streamed_exec=False,
        )
        .when_matched_update(
            updates={"dispatched_seq": "greatest(t.dispatched_seq, s.dispatched_seq)"},
            predicate="t.dispatched_seq < s.dispatched_seq AND (NOT s._checked "
            f"OR t.{S.INCARNATION} IS NOT DISTINCT FROM s._life)",
        )
        .execute()
    )
    return int(metrics.get("num_target_rows_updated", 0))

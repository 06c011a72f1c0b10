"""Reads of the document table: SQL over one snapshot through DataFusion, ids read in chunks, and
the SQL literals the reads and the MERGEs share.

Why its own module: a read is a pure function of a snapshot. The store (``outbox.delta.store``)
decides which snapshot (it refreshes the handle under its lock); these functions only ask it, and
work around two deltalake 1.6.6 limits, each explained where it is handled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from outbox.delta.table import deltalake, store_error


def query(dt: Any, sql: str, uri: str) -> pa.Table:
    """Run SQL over ``dt``'s current snapshot with DataFusion (registered as ``t``).

    Why not ``to_pyarrow_table(filters=...)``: in deltalake 1.6.6 it prunes partitions only
    through the deprecated ``partitions=`` argument, and once a Delta checkpoint exists its
    string statistics come back as ``string_view`` and every filter on ``id`` fails with
    "no kernel matching input types (string, string_view)". DataFusion prunes by partition
    and file statistics and reads one document in about 5 ms.
    """
    dl = deltalake()
    try:
        reader = dl.QueryBuilder().register("t", dt).execute(sql)
        return plain_strings(pa.RecordBatchReader.from_stream(reader).read_all())
    except (OSError, pa.ArrowException, dl.exceptions.DeltaError) as e:
        raise store_error(f"reading {uri} failed", e) from e


def scan(
    run: Callable[[str], pa.Table],
    ids: Sequence[str],
    columns: list[str] | None,
    bucket: Callable[[str], int],
    chunk: int,
) -> pa.Table:
    """The rows of ``ids`` (through ``run``, one SQL query each), ``chunk`` ids per query.

    Why chunks: DataFusion (deltalake 1.6.6) plans ``id IN (...)`` recursively, and a list of
    100,000 literals overflowed its stack: a unit of work with 100,000 documents killed the
    process with SIGSEGV (tests/write_path/test_unit_of_work.py has the regression test).
    """
    cols = ", ".join(columns) if columns else "*"
    if not ids:  # the file id index ruled every id out: no rows, the same columns
        return run(f"SELECT {cols} FROM t WHERE false")
    parts = []
    for start in range(0, max(len(ids), 1), chunk):
        part = ids[start : start + chunk]
        buckets = in_list(bucket(i) for i in part)
        parts.append(
            run(f"SELECT {cols} FROM t WHERE bucket IN ({buckets}) AND id IN ({quote_ids(part)})")
        )
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def in_list(values: Iterable[int]) -> str:
    """SQL list literal of bucket numbers, sorted and unique."""
    return ", ".join(str(v) for v in sorted(set(values)))


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def quote_ids(ids: Iterable[str]) -> str:
    """SQL list literal of ids, for predicates passed to delta-rs."""
    return ", ".join(_sql_str(i) for i in ids)


def plain_strings(table: pa.Table) -> pa.Table:
    """Cast ``string_view`` (what DataFusion returns) to ``string``, which every kernel takes."""
    if not any("string_view" in str(f.type) for f in table.schema):
        return table
    fields = [pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema]
    return table.cast(pa.schema(fields))


def _plain(t: pa.DataType) -> pa.DataType:
    if str(t) == "string_view":
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    return t

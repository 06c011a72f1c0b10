"""The Delta side of ``outbox migrate``: create the document table, or bring an old one up to date.

Upgrading means: turn the change data feed on, add the ``incarnation`` column to a table created
before it, add the ``deleted`` column (schema version 3: deletes as tombstone versions), and
record the outbox metadata (schema version, bucket count, table id) in the table
description. A table whose columns are not the document schema is refused rather than altered: it
is somebody else's table.

Adding the column is ``DeltaTable.alter.add_columns`` (deltalake 1.6.6): one metadata-only commit,
no data rewritten and no protocol upgrade; the change data feed reads across it, with a null
``incarnation`` in the images written before (tests/write_path/test_incarnation.py checks both).
Existing rows keep a null incarnation, so their message ids keep the old formula exactly. The
``deleted`` column is added the same way; existing rows read null, i.e. live documents.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from outbox.core.errors import SchemaMismatchError, StoreError
from outbox.core.model import bucket_of
from outbox.delta import schema as S
from outbox.delta.remote import explain
from outbox.delta.store import DeltaDocumentStore
from outbox.delta.table import unreadable_log


def ensure_table(
    uri: str, *, buckets: int, storage_options: Mapping[str, str] | None = None
) -> list[str]:
    """Create or upgrade the table at ``uri``; returns what was done (empty: already current)."""
    import deltalake
    from deltalake.exceptions import DeltaError

    opts = dict(storage_options or {}) or None
    try:
        if DeltaDocumentStore.create(uri, buckets=buckets, storage_options=opts):
            return [f"created Delta table {uri} ({buckets} buckets, change data feed on)"]
        dt = deltalake.DeltaTable(uri, storage_options=opts)
    except (DeltaError, OSError) as e:
        told = explain(uri, opts or {}, e)  # an object store that cannot be reached
        if told is not e:
            raise told from None
        if isinstance(e, DeltaError):  # a log deltalake cannot read: the file, not a backtrace
            raise unreadable_log(uri, e) from None
        raise StoreError(f"cannot create or open the Delta table at {uri}: {_first_line(e)}") from e
    done: list[str] = []
    mismatch = S.describe_mismatch(pa.schema(dt.schema().to_arrow()))
    if mismatch:
        raise SchemaMismatchError(
            f"the table at {uri} is not an outbox document table: {mismatch}",
            hint="point table_uri at a new location; migrate never rewrites a foreign table",
        )
    meta = dt.metadata()
    if list(meta.partition_columns) != ["bucket"]:
        raise SchemaMismatchError(
            f"the table at {uri} is partitioned by {list(meta.partition_columns)}, expected "
            "['bucket']",
            hint="migrate a new location; repartitioning an existing table is not supported",
        )
    try:
        if (meta.configuration or {}).get(S.CDF_PROPERTY, "").lower() != "true":
            dt.alter.set_table_properties({S.CDF_PROPERTY: "true"})
            done.append(f"enabled the change data feed on {uri}")
        missing = {
            k: v for k, v in S.STATE_PROPERTIES.items() if k not in (meta.configuration or {})
        }
        if missing:
            dt.alter.set_table_properties(missing)
            done += [f"set {k} = {v!r} on {uri} ({_WHY[k]})" for k, v in missing.items()]
        done += _add_columns(dt, uri)
        outbox_meta = S.parse_description(meta.description)
        was = int(outbox_meta.get(S.SCHEMA_VERSION_KEY, 0)) if outbox_meta else 0
        if was < S.SCHEMA_VERSION:
            n = int(outbox_meta.get(S.BUCKETS_KEY, buckets))
            _check_buckets(dt, uri, n)
            dt.alter.set_table_description(
                S.describe_table(
                    S.SCHEMA_VERSION, n, str(outbox_meta.get(S.TABLE_ID_KEY) or uuid.uuid4())
                )
            )
            now = "deletes write a tombstone version from now on"
            if was < 2:
                now = "saves append a row per document version and " + now
            done.append(
                f"recorded outbox schema version {S.SCHEMA_VERSION} on {uri} ({now}; the rows "
                "already there read the same; releases before it refuse the table)"
            )
    except (DeltaError, OSError, ValueError) as e:
        raise StoreError(f"upgrading the Delta table at {uri} failed: {_first_line(e)}") from e
    return done


#: What ``ensure_table`` says when it sets a state property (docs/delta.md, "What the table's
#: state holds").
_WHY = {
    S.TXN_RETENTION_PROPERTY: "without it no checkpoint drops an application transaction; the "
    "saves' own are written expired, so it bounds only other writers'",
    S.TOMBSTONE_RETENTION_PROPERTY: "how long a removed file's tombstone stays in the "
    "checkpoints; the log trim deletes removed files, so a vacuum of your own should be "
    "`outbox maintain`",
}


def _first_line(e: BaseException) -> str:
    """deltalake's message without what follows its first line: with ``RUST_BACKTRACE`` set, a
    Rust backtrace of a dozen lines."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _add_columns(dt: Any, uri: str) -> list[str]:
    """Add ``incarnation`` and ``deleted`` where missing, in that order; what was done."""
    done = []
    if S.is_legacy(pa.schema(dt.schema().to_arrow())):
        _add_column(dt, S.INCARNATION, "string")
        done.append(
            f"added the {S.INCARNATION!r} column to {uri} (existing rows keep their "
            "message ids; documents created from now on get ids a re-created document "
            "never repeats)"
        )
    if not S.has_deleted(pa.schema(dt.schema().to_arrow())):
        _add_column(dt, S.DELETED, "boolean")
        done.append(
            f"added the {S.DELETED!r} column to {uri} (uow.delete writes a tombstone "
            "version; the rows already there are live documents)"
        )
    return done


def _add_column(dt: Any, name: str, kind: str) -> None:
    """Add a nullable column at the end, where new tables have it too (``incarnation`` before
    ``deleted``, as ``DOCUMENT_SCHEMA`` orders them).

    Two migrations racing: the loser's commit fails; if the column is there now, that is done.
    """
    from deltalake.exceptions import DeltaError
    from deltalake.schema import Field, PrimitiveType

    try:
        dt.alter.add_columns([Field(name, PrimitiveType(kind), nullable=True)])
    except DeltaError:
        dt.update_incremental()
        if name not in pa.schema(dt.schema().to_arrow()).names:
            raise


def _check_buckets(dt: Any, uri: str, buckets: int) -> None:
    """Refuse to record N unless every existing row sits in ``crc32(id) % N``.

    A wrong N would be silent and harmful: every read carries a literal bucket filter, so rows in
    other buckets are invisible to it, and a "new" document would be inserted a second time.
    """
    from deltalake import QueryBuilder

    reader = QueryBuilder().register("t", dt).execute("SELECT id, bucket FROM t")
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    ids, got = table.column("id").to_pylist(), table.column("bucket").to_pylist()
    wrong = [(i, b) for i, b in zip(ids, got, strict=True) if bucket_of(str(i), buckets) != b]
    if wrong:
        doc_id, b = wrong[0]
        raise SchemaMismatchError(
            f"the table at {uri} holds {len(wrong)} row(s) whose bucket is not crc32(id) % "
            f"{buckets} (e.g. id {doc_id!r} in bucket {b})",
            hint="set `buckets` to the N the table was written with, then migrate again",
        )

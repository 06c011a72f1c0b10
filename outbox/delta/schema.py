"""The Delta table of documents: its Arrow schema, table properties, and row <-> Arrow mapping.

This schema is the contract with other writers (a Spark job, say), so it is spelled out in
docs/table.md. The table's *description* holds a JSON object ``{"outbox": {...}}``:
``schemaVersion`` records which layout a table has, ``buckets`` fixes N in
``bucket = crc32(id) % N``, and ``tableId`` is the stable identity that message ids derive from.

The ``incarnation`` column came later: a table created before it (the *legacy* layout) is still
an outbox table, not a foreign one, and ``outbox migrate`` upgrades it by adding the column (a
metadata-only commit; the change data feed reads across it, older images with a null
``incarnation``). ``schemaVersion`` stays 1 on purpose: the column's presence is the upgrade, and
a writer of the previous release keeps working on an upgraded table (its inserts carry a null
incarnation, i.e. the old ids).

The ``deleted`` column (schema version 3) marks a *tombstone*: the version ``uow.delete`` writes.
Unlike ``incarnation`` it does raise ``schemaVersion``: a release before it would read a tombstone
as a live document (and save over it), so it must refuse the table, which it does for a version
higher than its own. ``outbox migrate`` adds the column (metadata only, like ``incarnation``);
null reads as false, so rows written before it, and a foreign writer's append that leaves it
out, are live documents.

Why the description and not table properties: deltalake 1.6.6 refuses every table property it
does not know ("Error parsing property 'outbox.buckets'"), even under a ``delta.`` prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from outbox.core.model import DocumentRow, OutboxMessage, encode_headers

#: 1: one row per document, updated in place. 2: one row per document *version*: a save appends
#: the new version and the upkeep folds the superseded ones away (docs/delta.md, "The versions
#: layout"). A table at 1 is one at 2 with every document at its first and only row, so
#: ``outbox migrate`` upgrades it by recording 2 (metadata only). 3: the ``deleted`` column, and
#: deletes through the library as tombstone versions; migrate adds the column (metadata only).
SCHEMA_VERSION = 3
CDF_PROPERTY = "delta.enableChangeDataFeed"
#: How long an application transaction stays in the table's state. A save's own are written
#: already expired (``outbox.delta.appends``), so this day is for other writers' idempotent
#: streams (Spark's ``txnAppId``); what matters here is that it is set: without it no checkpoint
#: drops any. A table that already sets it keeps its own value.
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
TXN_RETENTION = "interval 1 days"
#: How long a removed file's tombstone stays in the checkpoints (Delta's default is a week). Every
#: file a save appends is removed again by the fold or compaction, so a week of tombstones grows
#: with the commit rate (16 a commit); the framework reads none (the log trim deletes removed
#: files from the commits, ``outbox.delta.log``). Fifteen minutes, the default ``log_retention``,
#: not less: delta-spark refuses to time travel (an as-of read, the Spark rescuer's change feed)
#: to a version older than this, whatever files remain; a vacuum run outside the framework takes
#: it as its default retention (docs/delta.md, "What the table's state holds").
TOMBSTONE_RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
TOMBSTONE_RETENTION = "interval 15 minutes"
#: The table properties that bound the table's state, set at creation and by ``outbox migrate``
#: when absent.
STATE_PROPERTIES = {
    TXN_RETENTION_PROPERTY: TXN_RETENTION,
    TOMBSTONE_RETENTION_PROPERTY: TOMBSTONE_RETENTION,
}
SCHEMA_VERSION_KEY = "schemaVersion"
BUCKETS_KEY = "buckets"
TABLE_ID_KEY = "tableId"
INCARNATION = "incarnation"
DELETED = "deleted"

TS = pa.timestamp("us", tz="UTC")

MESSAGE_TYPE = pa.struct(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("destination", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("body", pa.string(), nullable=False),
        pa.field("content_type", pa.string()),
        pa.field("headers", pa.string()),  # JSON object of string -> string
        pa.field("ordering_key", pa.string()),
        pa.field("correlation_id", pa.string()),
        pa.field("deliver_at", TS),
        pa.field("created_at", TS),
    ]
)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("last_seq", pa.int64(), nullable=False),
        pa.field("dispatched_seq", pa.int64(), nullable=False),
        pa.field("outbox", pa.list_(pa.field("element", MESSAGE_TYPE, nullable=True))),
        pa.field("updated_at", TS),
        pa.field("bucket", pa.int32(), nullable=False),
        # Last, where ``ALTER TABLE ADD COLUMNS`` puts it on an upgraded table: both layouts agree.
        pa.field(INCARNATION, pa.string()),
        # Null or false: a live document; true: a tombstone (schema version 3, added last).
        pa.field(DELETED, pa.bool_()),
    ]
)

#: The columns every outbox table has, upgraded or not (all but ``incarnation`` and
#: ``deleted``).
LEGACY_SCHEMA = pa.schema([f for f in DOCUMENT_SCHEMA if f.name not in (INCARNATION, DELETED)])
#: The columns of a table at schema version 2 (before ``deleted``).
V2_SCHEMA = pa.schema([f for f in DOCUMENT_SCHEMA if f.name != DELETED])

#: Columns a pending check and a watermark update need; never the (large) outbox or state.
CONTROL_COLUMNS = ["id", "version", "last_seq", "dispatched_seq", "bucket", INCARNATION]
#: What a save's re-check reads: the control columns and whether the newest row is a tombstone.
RECHECK_COLUMNS = [*CONTROL_COLUMNS, DELETED]


def describe_table(schema_version: int, buckets: int, table_id: str) -> str:
    """The table description that carries the outbox metadata."""
    return json.dumps(
        {
            "outbox": {
                SCHEMA_VERSION_KEY: schema_version,
                BUCKETS_KEY: buckets,
                TABLE_ID_KEY: table_id,
            }
        }
    )


def parse_description(description: str | None) -> dict[str, Any]:
    """The outbox metadata from a table description; ``{}`` when absent or not ours."""
    if not description:
        return {}
    try:
        data = json.loads(description)
    except ValueError:
        return {}
    meta = data.get("outbox") if isinstance(data, dict) else None
    return meta if isinstance(meta, dict) else {}


def _ts(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    raise TypeError(f"not a timestamp: {value!r}")


def message_from_struct(m: Mapping[str, Any]) -> OutboxMessage:
    headers = m.get("headers")
    return OutboxMessage(
        seq=int(m["seq"]),
        message_id=str(m["message_id"]),
        destination=str(m["destination"]),
        type=str(m["type"]),
        body=str(m["body"]),
        content_type=m.get("content_type") or "application/json",
        headers=json.loads(headers) if headers else {},
        ordering_key=m.get("ordering_key"),
        correlation_id=m.get("correlation_id"),
        deliver_at=_ts(m.get("deliver_at")),
        created_at=_ts(m.get("created_at")),
    )


def message_to_struct(m: OutboxMessage) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "message_id": m.message_id,
        "destination": m.destination,
        "type": m.type,
        "body": m.body,
        "content_type": m.content_type,
        "headers": encode_headers(m.headers) if m.headers else None,
        "ordering_key": m.ordering_key,
        "correlation_id": m.correlation_id,
        "deliver_at": m.deliver_at,
        "created_at": m.created_at,
    }


def rows_from_table(table: pa.Table) -> list[DocumentRow]:
    rows: list[DocumentRow] = []
    for r in table.to_pylist():
        rows.append(
            DocumentRow(
                id=r["id"],
                type=r["type"],
                version=int(r["version"]),
                state=json.loads(r["state"]),
                last_seq=int(r["last_seq"]),
                dispatched_seq=int(r["dispatched_seq"]),
                outbox=[message_from_struct(m) for m in (r.get("outbox") or [])],
                updated_at=_ts(r.get("updated_at")),
                incarnation=r.get(INCARNATION),
                deleted=bool(r.get(DELETED)),
            )
        )
    return rows


def table_from_rows(
    rows: Iterable[tuple[DocumentRow, int]],
    *,
    extra: Mapping[str, tuple[pa.DataType, list[Any]]],
    states: Sequence[str | None] | None = None,
) -> pa.Table:
    """Arrow source for a MERGE: the document columns plus ``extra`` control columns.

    ``states``: each row's state already encoded (None: encode it here), so a unit of work's
    state is encoded once for its check and its save, not twice.
    """
    cols: dict[str, list[Any]] = {f.name: [] for f in DOCUMENT_SCHEMA}
    for i, (row, bucket) in enumerate(rows):
        cols["id"].append(row.id)
        cols["type"].append(row.type)
        cols["version"].append(row.version)
        encoded = states[i] if states is not None else None
        if encoded is None:
            encoded = json.dumps(row.state, separators=(",", ":"), sort_keys=True)
        cols["state"].append(encoded)
        cols["last_seq"].append(row.last_seq)
        cols["dispatched_seq"].append(row.dispatched_seq)
        cols["outbox"].append([message_to_struct(m) for m in row.outbox])
        cols["updated_at"].append(row.updated_at)
        cols["bucket"].append(bucket)
        cols[INCARNATION].append(row.incarnation)
        cols[DELETED].append(row.deleted)
    arrays = [pa.array(cols[f.name], type=f.type) for f in DOCUMENT_SCHEMA]
    fields = list(DOCUMENT_SCHEMA)
    for name, (dtype, values) in extra.items():
        arrays.append(pa.array(values, type=dtype))
        fields.append(pa.field(name, dtype))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def describe_mismatch(actual: pa.Schema) -> str | None:
    """None when ``actual`` has the document columns with compatible types, else what differs.

    The legacy layouts (no ``incarnation``, no ``deleted``) pass: they are ours, ``outbox
    migrate`` upgrades them; ``is_legacy`` and ``has_deleted`` tell them apart.
    """
    problems: list[str] = []
    names = set(actual.names)
    for f in DOCUMENT_SCHEMA:
        if f.name not in names:
            if f.name not in (INCARNATION, DELETED):
                problems.append(f"missing column {f.name!r}")
            continue
        got = actual.field(f.name).type
        if not _compatible(got, f.type):
            problems.append(f"column {f.name!r} is {got}, expected {f.type}")
    return "; ".join(problems) or None


def is_legacy(actual: pa.Schema) -> bool:
    """True for a table created before incarnations (``outbox migrate`` adds the column)."""
    return INCARNATION not in actual.names


def has_deleted(actual: pa.Schema) -> bool:
    """True for a table with the ``deleted`` column (schema version 3)."""
    return DELETED in actual.names


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    if got == want:
        return True
    if pa.types.is_list(want) or pa.types.is_large_list(want) or pa.types.is_struct(want):
        return _compatible_nested(got, want)
    return _compatible_leaf(got, want)


def _compatible_leaf(got: pa.DataType, want: pa.DataType) -> bool:
    """Any string for a string, any integer for an integer, any timestamp for a timestamp."""
    if pa.types.is_string(want):
        return pa.types.is_string(got) or pa.types.is_large_string(got) or str(got) == "string_view"
    if pa.types.is_integer(want):
        return bool(pa.types.is_integer(got))
    if pa.types.is_timestamp(want):
        return bool(pa.types.is_timestamp(got))
    if pa.types.is_boolean(want):
        return bool(pa.types.is_boolean(got))
    return False


def _compatible_nested(got: pa.DataType, want: pa.DataType) -> bool:
    """A list of compatible items; a struct with at least the wanted fields, each compatible."""
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _compatible(
            got.value_type, want.value_type
        )
    if not pa.types.is_struct(got):
        return False
    have = {got.field(i).name: got.field(i).type for i in range(got.num_fields)}
    return all(
        want.field(i).name in have and _compatible(have[want.field(i).name], want.field(i).type)
        for i in range(want.num_fields)
    )

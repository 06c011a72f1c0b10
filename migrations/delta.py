"""The Delta side of ``outbox migrate``: create the document table, or bring an old one up to date.

Upgrading means: turn the change data feed on, and record the outbox metadata (schema version,
bucket count, table id) in the table description. A table whose columns are not the document
schema is refused rather than altered: it is somebody else's table.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pyarrow as pa

from outbox.delta import schema as S
from outbox.delta.store import DeltaDocumentStore
from outbox.errors import SchemaMismatchError, StoreError


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
        raise StoreError(f"cannot create or open the Delta table at {uri}: {e}") from e
    done: list[str] = []
    mismatch = S.describe_mismatch(pa.schema(dt.schema().to_arrow()))
    if mismatch:
        raise SchemaMismatchError(
            f"the table at {uri} is not an outbox document table: {mismatch}",
            hint="point table_uri at a new location; migrate never rewrites a foreign table",
        )
    meta = dt.metadata()
    if (meta.configuration or {}).get(S.CDF_PROPERTY, "").lower() != "true":
        dt.alter.set_table_properties({S.CDF_PROPERTY: "true"})
        done.append(f"enabled the change data feed on {uri}")
    outbox_meta = S.parse_description(meta.description)
    if not outbox_meta or int(outbox_meta.get(S.SCHEMA_VERSION_KEY, 0)) < S.SCHEMA_VERSION:
        dt.alter.set_table_description(
            S.describe_table(
                S.SCHEMA_VERSION,
                int(outbox_meta.get(S.BUCKETS_KEY, buckets)),
                str(outbox_meta.get(S.TABLE_ID_KEY) or uuid.uuid4()),
            )
        )
        done.append(f"recorded outbox schema version {S.SCHEMA_VERSION} on {uri}")
    return done

"""The document table at the driver's edge: open it, check it is an outbox table, create it, and
turn deltalake's errors into ours.

Why its own module: these run once per handle (or once per damaged table), hold no state and take
no lock, so the store (``outbox.delta.store``) keeps only what its lock guards. deltalake is
imported on first use, as everywhere in the store.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from outbox.core.errors import (
    ChangeDataFeedDisabledError,
    SchemaMismatchError,
    StoreError,
    TableNotFoundError,
)
from outbox.delta import schema as S
from outbox.delta.remote import explain

DEFAULT_BUCKETS = 16


@dataclass(frozen=True, slots=True)
class TableInfo:
    uri: str
    table_id: str
    buckets: int
    schema_version: int
    version: int


def deltalake() -> Any:
    import deltalake

    return deltalake


def commit_failed(e: BaseException) -> bool:
    """Another writer committed first (deltalake's ``CommitFailedError``): retry on a refreshed
    handle."""
    from deltalake.exceptions import CommitFailedError

    return isinstance(e, CommitFailedError)


def open_table(uri: str, storage_options: Mapping[str, str]) -> Any:
    """A ``deltalake.DeltaTable`` at its newest version, or our error saying what to do."""
    dl = deltalake()
    from deltalake.exceptions import DeltaError as DlDeltaError
    from deltalake.exceptions import TableNotFoundError as DlNotFound

    try:
        return dl.DeltaTable(uri, storage_options=dict(storage_options) or None)
    except DlNotFound as e:
        raise TableNotFoundError(
            f"no Delta table at {uri}", hint="run `outbox migrate` to create it"
        ) from e
    except (OSError, DlDeltaError) as e:
        told = explain(uri, storage_options, e)  # an object store that cannot be reached
        if told is not e:
            raise told from None
        if isinstance(e, OSError):
            raise TableNotFoundError(f"cannot open the Delta table at {uri}: {e}") from e
        raise unreadable_log(uri, e) from e  # a damaged log: one line, not a kernel traceback


def validate(dt: Any, uri: str) -> TableInfo:
    """``dt``'s outbox metadata, or ``SchemaMismatchError``/``ChangeDataFeedDisabledError`` when
    it is no (current) outbox document table."""
    meta = dt.metadata()
    config: dict[str, str] = dict(meta.configuration or {})
    if config.get(S.CDF_PROPERTY, "").lower() != "true":
        raise ChangeDataFeedDisabledError(
            f"the table at {uri} does not have the change data feed enabled",
            hint="run `outbox migrate` (or ALTER TABLE ... SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true))",
        )
    mismatch = S.describe_mismatch(pa.schema(dt.schema().to_arrow()))
    if mismatch:
        raise SchemaMismatchError(
            f"the table at {uri} is not an outbox document table: {mismatch}",
            hint="point the workspace at an outbox table, or migrate a new path",
        )
    if list(meta.partition_columns) != ["bucket"]:
        raise SchemaMismatchError(
            f"the table at {uri} is partitioned by {list(meta.partition_columns)}, "
            "expected ['bucket']",
            hint="recreate it with `outbox migrate` on a new path",
        )
    if S.is_legacy(pa.schema(dt.schema().to_arrow())):
        raise SchemaMismatchError(
            f"the table at {uri} predates document incarnations (no {S.INCARNATION!r} column)",
            hint="run `outbox migrate` to upgrade it: it adds the column, and existing rows "
            "keep their message ids",
        )
    outbox_meta = S.parse_description(meta.description)
    try:
        buckets = int(outbox_meta[S.BUCKETS_KEY])
        table_id = str(outbox_meta[S.TABLE_ID_KEY])
        schema_version = int(outbox_meta.get(S.SCHEMA_VERSION_KEY, 0))
    except (KeyError, ValueError, TypeError) as e:
        raise SchemaMismatchError(
            f"the table at {uri} lacks the outbox metadata in its description ({e})",
            hint="run `outbox migrate` to record them",
        ) from e
    if schema_version > S.SCHEMA_VERSION:
        raise SchemaMismatchError(
            f"the table at {uri} has outbox schema version {schema_version}; this "
            f"version of delta-outbox understands up to {S.SCHEMA_VERSION}",
            hint="upgrade delta-outbox",
        )
    if schema_version < S.SCHEMA_VERSION:
        was = (
            "one row per document, updated in place"
            if schema_version < 2
            else f"no {S.DELETED!r} column, so no deletes through the library"
        )
        raise SchemaMismatchError(
            f"the table at {uri} is at outbox schema version {schema_version} ({was}); this "
            f"version of delta-outbox writes version {S.SCHEMA_VERSION} (a row per document "
            "version, a delete as a tombstone version)",
            hint="run `outbox migrate`: the upgrade adds the column and records the new version "
            "(metadata only, no row rewritten), and the rows already there read the same",
        )
    if not S.has_deleted(pa.schema(dt.schema().to_arrow())):
        raise SchemaMismatchError(
            f"the table at {uri} records outbox schema version {schema_version} but has no "
            f"{S.DELETED!r} column",
            hint="run `outbox migrate` to add it (metadata only)",
        )
    return TableInfo(uri, table_id, buckets, schema_version, dt.version())


def create_table(
    uri: str, *, buckets: int, storage_options: Mapping[str, str] | None, table_id: str | None
) -> bool:
    """Create the table if it is missing. Returns True when it was created."""
    dl = deltalake()
    if dl.DeltaTable.is_deltatable(uri, storage_options=dict(storage_options or {}) or None):
        return False
    dl.DeltaTable.create(
        uri,
        schema=S.DOCUMENT_SCHEMA,
        partition_by=["bucket"],
        mode="ignore",
        name="outbox_documents",
        description=S.describe_table(S.SCHEMA_VERSION, buckets, table_id or str(uuid.uuid4())),
        configuration={S.CDF_PROPERTY: "true", **S.STATE_PROPERTIES},
        storage_options=dict(storage_options or {}) or None,
    )
    return True


def unreadable_log(uri: str, error: Exception) -> StoreError:
    """The error for a table whose log deltalake cannot read, naming the damaged commit file
    when the table is local (deltalake's own message names no file)."""
    log_dir = local_log_dir(uri)
    damaged = None
    if log_dir is not None and log_dir.is_dir():
        for f in sorted(log_dir.glob("*.json")):
            try:
                for line in f.read_text().splitlines():
                    if line.strip():
                        json.loads(line)
            except (ValueError, OSError):
                damaged = f
                break
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if damaged is not None:
        return StoreError(
            f"the Delta log of the table at {uri} is damaged: {damaged.name} is not valid JSON "
            f"({first})",
            hint=f"restore {damaged} from a backup or a replica; Delta cannot rebuild its log "
            "from the data files",
        )
    return StoreError(
        f"the Delta log of the table at {uri} cannot be read: {first}",
        hint="restore the damaged file in _delta_log from a backup or a replica",
    )


def local_log_dir(uri: str) -> Path | None:
    """``_delta_log`` of a table on the local file system (None for object stores)."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = Path(uri.removeprefix("file://"))
    return path / "_delta_log"


def store_error(what: str, e: BaseException) -> StoreError:
    """Our error for a deltalake, pyarrow or OS error (an ``OutboxError`` passes as it is)."""
    if isinstance(e, StoreError):
        return e
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return StoreError(f"{what}: {first}")

"""The current documents in Spark: a DataFrame, a temporary view, a view in a catalog.

Every form runs ``outbox.delta.current.current_sql``, the rule the library's own reads use, so a
Spark SQL user, a notebook and the library see the same documents (tests/spark/
test_current_view.py compares them on a table taken through every state of the layout).

* ``documents(as_of)``: a DataFrame read with the store's credentials (Hadoop ``fs.*`` options)
  at the newest version or at the version ``as_of`` resolves to; it is that version's
  documents, fixed when it is built.
* ``register_view(name)``: ``CREATE OR REPLACE TEMP VIEW name AS <current_sql over
  delta.`<uri>`>``, re-read at each query, so ``spark.table(name)`` always shows the current
  documents; ``persistent=True`` creates the same view in the session's catalog
  (``CREATE OR REPLACE VIEW [database.]name``), which needs a catalog that stores views (a Hive
  metastore, Unity Catalog) and credentials on the cluster, not per read.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from outbox.core.errors import HistoryGoneError, StoreError, ValidationError
from outbox.delta import current, reads
from outbox.delta import schema as S
from outbox.delta.table import open_table

#: The name ``register_view`` gives by default.
DEFAULT_VIEW = "documents_current"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: delta-spark's words for a version it will not time travel to (docs/delta.md: the table's
#: ``delta.deletedFileRetentionDuration``, or a log trimmed past it).
_TOO_OLD = (
    "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION",
    "VersionNotFoundException",
    "DELTA_VERSION_NOT_FOUND",
    "DELTA_CANNOT_TIME_TRAVEL",
)


def table_has_deleted(sob: Any) -> bool:
    """Whether the outbox's table has the tombstone column (schema version 3)."""
    return S.has_deleted(pa.schema(sob.store.delta_table.schema().to_arrow()))


def documents(sob: Any, as_of: reads.AsOf | None = None) -> Any:
    """The current documents of ``sob``'s table as a Spark DataFrame (now, or ``as_of`` a
    version or a time, resolved as ``Outbox.documents`` resolves it)."""
    reader, uri = sob._reader(), sob.table_uri
    if as_of is not None:
        storage = sob.settings.storage_options
        version = reads.resolve_version(
            open_table(uri, storage),
            uri,
            as_of,
            storage_options=storage,
            log_retention=sob.settings.log_retention,
        )
        reader = reader.option("versionAsOf", version)
    try:
        rows = reader.load(uri)
        tombstones = S.DELETED in rows.columns  # at that version (the column came later)
        return sob.spark.sql(current.current_sql("{rows}", has_deleted=tombstones), rows=rows)
    except Exception as e:
        text = str(e)
        if as_of is not None and any(s in text for s in _TOO_OLD):
            raise HistoryGoneError(
                f"Spark cannot read {uri} as of {as_of!r}: {_first_line(e)}",
                hint="read a newer version; delta-spark time travels only within the table's "
                "delta.deletedFileRetentionDuration and the history log_retention keeps",
            ) from e
        what = f"reading the documents of {uri} with Spark failed"
        raise StoreError(f"{what}: {_first_line(e)}") from e


def view_sql(uri: str, *, has_deleted: bool = True) -> str:
    """The view's query over the table at ``uri`` (Spark and Databricks SQL)."""
    return current.current_sql(f"delta.`{uri.replace('`', '``')}`", has_deleted=has_deleted)


def register_view(
    sob: Any,
    name: str = DEFAULT_VIEW,
    *,
    persistent: bool = False,
    database: str | None = None,
) -> str:
    """Create (or replace) the view of the current documents; returns its name as Spark SQL
    refers to it. ``persistent=False``: a temporary view of this session; ``True``: a view in the
    catalog (``database``, else the current one)."""
    for what, value in (("view name", name), ("database", database)):
        if value is not None and not _NAME.match(value):
            raise ValidationError(
                f"{what} {value!r} is not a plain SQL identifier",
                hint="use letters, digits and underscores, not starting with a digit",
            )
    if database is not None and not persistent:
        raise ValidationError(
            "a temporary view has no database", hint="pass persistent=True, or leave database out"
        )
    query = view_sql(sob.table_uri, has_deleted=table_has_deleted(sob))
    qualified = name if database is None else f"{database}.{name}"
    kind = "VIEW" if persistent else "TEMP VIEW"
    try:
        sob.spark.sql(f"CREATE OR REPLACE {kind} {qualified} AS {query}")
    except Exception as e:
        raise StoreError(
            f"creating the {kind.lower()} {qualified} failed: {_first_line(e)}",
            hint="a persistent view needs a catalog that stores views (a Hive metastore, "
            "Unity Catalog); a temporary view needs none"
            if persistent
            else None,
        ) from e
    return qualified


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

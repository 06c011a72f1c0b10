"""The change data feed read from the log and the files each commit wrote, as the Delta protocol
defines it: per commit, its change files (``cdc`` actions) when it wrote any, else its added
files as inserts and its removed files as deletes (only actions that change data: a compaction's
are skipped).

Why beside deltalake's ``load_cdf``: deltalake 1.6's feed reader refuses the files delta-spark
writes when it reads their ``outbox`` column or filters by partition: Spark writes every Parquet
field nullable (and timestamps as INT96), and the reader will not cast the message structs to
the table's non-null fields ("Cannot cast nullable struct field 'seq' to non-nullable field").
Plain Parquet reads of the same files work. The trace reads a document's few commits this way
(``outbox.app.trace.changes``); ``outbox replay`` falls back to it for a range Spark wrote to
(``dispatcher.replay_feed``). docs/trace.md, "Tables Spark wrote to", has the measurement.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa


def spark_written(error: BaseException) -> bool:
    """Whether a ``load_cdf`` read failed on files Spark wrote (the module docstring)."""
    return "Cannot cast nullable struct field" in str(error)


def table_filesystem(uri: str, storage_options: Mapping[str, str] | None) -> tuple[Any, bool]:
    """(a pyarrow file system rooted at the table, whether it is local). A local table is read
    through pyarrow's own file system: the deltalake handler's calls cost more than the reads."""
    from outbox.delta.log import _filesystem
    from outbox.delta.table import local_log_dir

    log_dir = local_log_dir(uri)
    if log_dir is None:
        return _filesystem(uri, storage_options or {}), False
    import pyarrow.fs as pfs

    return pfs.SubTreeFileSystem(str(log_dir.parent.absolute()), pfs.LocalFileSystem()), True


def committed_at(info: Mapping[str, Any]) -> datetime | None:
    """When a commit was made, from its ``commitInfo`` (the in-commit timestamp when it has one)."""
    ms = info.get("inCommitTimestamp") or info.get("timestamp")
    return datetime.fromtimestamp(int(ms) / 1000, tz=UTC) if ms is not None else None


def changed_files(actions: list[dict[str, Any]]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(path, change type or None when the file carries ``_change_type``, partition values) of
    every file holding the commit's change data."""
    cdc = [a["cdc"] for a in actions if isinstance(a.get("cdc"), dict)]
    if cdc:
        return [(unquote(c["path"]), None, c.get("partitionValues") or {}) for c in cdc]
    out: list[tuple[str, str | None, dict[str, Any]]] = []
    for kind, change in (("add", "insert"), ("remove", "delete")):
        for a in actions:
            f = a.get(kind)
            if isinstance(f, dict) and f.get("dataChange", True):
                out.append((unquote(f["path"]), change, f.get("partitionValues") or {}))
    return out


def bucket_of(partition: Mapping[str, Any]) -> int | None:
    value = partition.get("bucket")
    return None if value is None else int(value)


def range_rows(
    uri: str,
    storage_options: Mapping[str, str] | None,
    start: int,
    end: int,
    columns: list[str],
    *,
    buckets: Collection[int] | None = None,
) -> list[pa.Table]:
    """The feed of versions ``start..end`` as tables, one per file, oldest commit first: the
    file's ``columns`` (those it has; ``bucket`` from its partition; ``_change_type``,
    ``_commit_version`` and ``_commit_timestamp`` as ``load_cdf`` names them). ``buckets``: only
    the files of those partitions. Plain strings; types as each file holds them (the caller
    casts to the table's)."""
    from outbox.delta.log import commit_actions, commit_info

    fs, _ = table_filesystem(uri, storage_options)
    out: list[pa.Table] = []
    for version in range(start, end + 1):
        actions = commit_actions(uri, version, fs)
        at = committed_at(commit_info(actions))
        for path, change, partition in changed_files(actions):
            bucket = bucket_of(partition)
            if buckets is not None and bucket is not None and bucket not in buckets:
                continue
            t = read_change_file(fs, version, path, change, columns)
            n = t.num_rows
            if "bucket" in columns and "bucket" not in t.column_names:
                t = t.append_column("bucket", pa.array([bucket] * n, pa.int64()))
            t = t.append_column("_commit_version", pa.array([version] * n, pa.int64()))
            stamp = pa.array([at] * n, pa.timestamp("us", tz="UTC"))
            out.append(t.append_column("_commit_timestamp", stamp))
    return out


def read_change_file(
    fs: Any, version: int, path: str, change: str | None, columns: Collection[str]
) -> pa.Table:
    """One change file of commit ``version`` (``changed_files``' path and change type): the
    ``columns`` it has, plain strings, and ``_change_type`` (its own, else ``change``)."""
    import pyarrow.parquet as pq

    from outbox.delta.reads import plain_strings

    if "://" in path:  # an absolute path (a shallow clone's): refused, not followed
        raise ValueError(f"commit {version} names a file outside the table: {path}")
    with fs.open_input_file(path) as f:
        data = pq.ParquetFile(f)
        has = set(data.schema_arrow.names)
        names = [c for c in (*columns, "_change_type") if c in has]
        t = plain_strings(data.read(columns=list(dict.fromkeys(names))))
    if "_change_type" not in t.column_names:
        t = t.append_column("_change_type", pa.array([change or "insert"] * t.num_rows))
    return t

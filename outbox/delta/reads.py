"""Reads of the document table: SQL over one snapshot through DataFusion, ids read in chunks, the
SQL literals the reads and the MERGEs share, and the readers of the current documents (now, or as
of a version or a time: ``documents``, ``read_store``, ``resolve_version``).

Why its own module: a read is a pure function of a snapshot. The store (``outbox.delta.store``)
decides which snapshot (it refreshes the handle under its lock); these functions only ask it, and
work around two deltalake 1.6.6 limits, each explained where it is handled. The rule that makes
documents of rows is ``outbox.delta.current``'s, called through its module (a test replaces it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.durations import format_duration
from outbox.core.errors import HistoryGoneError, StoreError, ValidationError
from outbox.delta import current, log
from outbox.delta import schema as S
from outbox.delta.schema import INCARNATION
from outbox.delta.table import deltalake, open_table, store_error


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


# --- reading them: now, or as of a version or a time ------------------------------------------

#: Ids per SQL query of an as-of read (``scan`` says why reads are chunked).
SCAN_CHUNK = 5_000
#: A table version, a time (naive: UTC), or ISO 8601 text for a time.
AsOf = int | datetime | str
Run = Callable[[str], pa.Table]
Scan = Callable[[Sequence[str], list[str] | None], pa.Table]


def documents(
    run: Run,
    rows_of: Scan,
    schema: pa.Schema,
    *,
    ids: Sequence[str] | None = None,
    type: str | None = None,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
) -> pa.Table:
    """The current documents of one snapshot, ordered by id: ``run`` runs SQL over it (as
    ``t``), ``rows_of`` reads the rows of some ids (the store's chunked, pruned read), ``schema`` is
    its Arrow schema. With ``ids``: those ids' rows, folded by ``current_rows`` (what the store's
    ``read`` does); without: ``current_sql``. ``type`` filters on the document's newest row."""
    out = current.output_columns(columns, include_deleted=include_deleted)
    tombstones = S.has_deleted(schema)
    if ids is not None:
        wanted = _check_ids(ids)
        needed = [*out, "id", "version", "dispatched_seq", INCARNATION, "type", S.DELETED]
        read = [c for c in dict.fromkeys(needed) if c != S.DELETED or tombstones]
        docs = current.current_rows(rows_of(wanted, read), include_deleted=include_deleted)
        if type is not None:
            docs = docs.filter(pc.equal(docs["type"], type))
        return current.project(docs, out)
    inner = current.current_sql(
        "t",
        columns=list(dict.fromkeys([*out, "id", "type"])),
        include_deleted=include_deleted,
        has_deleted=tombstones,
    )
    where = "" if type is None else f" WHERE type = {quote_ids([type])}"
    return run(f"SELECT {', '.join(out)} FROM ({inner}) AS _c{where} ORDER BY id")


def _check_ids(ids: Sequence[str]) -> list[str]:
    if isinstance(ids, str) or not all(isinstance(i, str) for i in ids):
        raise ValidationError(
            f"ids must be a list of document ids (strings), got {ids!r}",
            hint="pass ids=['a', 'b'], or leave ids out for every document",
        )
    return list(dict.fromkeys(ids))


def read_store(
    store: Any,
    ids: Sequence[str] | None = None,
    *,
    as_of: AsOf | None = None,
    log_retention: float | None = None,
    **options: Any,
) -> pa.Table:
    """``documents`` of a ``DeltaDocumentStore``: now (the store's own read path under its lock,
    after its unwritten watermarks are flushed, as ``store.read`` does), or as of a version or
    time (``resolve_version``, then a handle at that version). ``options``: ``documents``'s
    ``type``, ``columns`` and ``include_deleted``. Why the store's private parts: this is its
    read, returning Arrow instead of decoded rows, in the package that owns it."""
    if as_of is None:
        store._barrier()
        with store._lock:
            store._check_open()
            store._update()
            schema = pa.schema(store.delta_table.schema().to_arrow())
            return documents(store._query, store._scan, schema, ids=ids, **options)
    uri, storage = store.uri, store._storage_options
    version = resolve_version(
        open_table(uri, storage),
        uri,
        as_of,
        storage_options=storage,
        log_retention=log_retention,
    )
    dt = open_version(uri, version, storage)

    def run(sql: str) -> pa.Table:
        return query(dt, sql, uri)

    def rows_of(wanted: Sequence[str], cols: list[str] | None) -> pa.Table:
        return scan(run, wanted, cols, store.bucket, SCAN_CHUNK)

    schema = pa.schema(dt.schema().to_arrow())
    try:
        return documents(run, rows_of, schema, ids=ids, **options)
    except StoreError as e:
        if not _missing_file(e):
            raise
        raise HistoryGoneError(
            f"version {version} of {uri} can no longer be read: a data file it needs was "
            f"deleted by a vacuum ({e})",
            hint="read a newer version; a vacuum's retention sets how long removed data files stay",
        ) from e


def _missing_file(e: BaseException) -> bool:
    text = str(e).lower()
    return "not found" in text or "no such file" in text or "does not exist" in text


def open_version(uri: str, version: int, storage_options: Mapping[str, str] | None) -> Any:
    """A ``deltalake.DeltaTable`` at ``version`` (driver errors translated)."""
    dl = deltalake()
    try:
        return dl.DeltaTable(
            uri, version=version, storage_options=dict(storage_options or {}) or None
        )
    except (OSError, dl.exceptions.DeltaError) as e:
        raise store_error(f"opening {uri} as of version {version} failed", e) from e


def resolve_version(
    dt: Any,
    uri: str,
    as_of: AsOf,
    *,
    storage_options: Mapping[str, str] | None = None,
    log_retention: float | None = None,
) -> int:
    """The table version ``as_of`` names: a version as it is, a time as the newest version
    committed at or before it. ``dt``: a handle at the newest version.

    Resolved here once, so every engine reads the same version: delta-rs and delta-spark each
    map a time to a version their own way (delta-spark by commit file times unless in-commit
    timestamps are on). Commit times are ``commitInfo.timestamp`` (the clock the rescuer reads),
    made increasing as Delta does (a commit no older than the one before counts as one
    millisecond after it). Before the history the table keeps (the log trim deletes commits
    older than ``log_retention``): ``HistoryGoneError`` naming the oldest readable version."""
    if isinstance(as_of, bool) or not isinstance(as_of, int | datetime | str):
        raise ValidationError(
            f"as_of must be a table version (int), a datetime or ISO 8601 text, got {as_of!r}",
            hint="pass as_of=42, as_of=datetime(2026, 11, 29, tzinfo=UTC) or "
            "as_of='2026-11-29T10:00:00Z'",
        )
    try:
        latest = int(dt.version())
    except Exception as e:
        raise store_error(f"reading the version of {uri} failed", e) from e
    oldest = oldest_readable(uri, storage_options)
    if isinstance(as_of, int):
        if as_of < 0 or as_of > latest:
            raise ValidationError(
                f"as_of version {as_of} is not a version of {uri} (its newest is {latest})",
                hint=f"pass a version from {oldest} to {latest}",
            )
        if as_of < oldest:
            raise _gone(f"version {as_of}", uri, oldest, log_retention)
        return as_of
    when = parse_time(as_of)
    chosen = None
    for version, ts in _commit_times(dt, uri, latest, oldest):
        if ts <= when:
            chosen = version
    if chosen is None:
        raise _gone(f"the time {when.isoformat()}", uri, oldest, log_retention)
    return chosen


def parse_time(value: datetime | str) -> datetime:
    """An aware UTC datetime from a datetime (naive: UTC) or ISO 8601 text."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValidationError(
                f"as_of {value!r} is neither a table version nor an ISO 8601 time",
                hint="pass an int version, a datetime, or text like 2026-11-29T10:00:00Z",
            ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _commit_times(dt: Any, uri: str, latest: int, oldest: int) -> list[tuple[int, datetime]]:
    """(version, commit time) of the retained commits, oldest first, made increasing."""
    try:
        entries = list(dt.history(latest - oldest + 1))
    except Exception as e:
        raise store_error(f"reading the history of {uri} failed", e) from e
    found = []
    for i, entry in enumerate(entries):  # newest first
        ts = entry.get("timestamp")
        if ts is not None:
            version = int(entry.get("version", latest - i))
            found.append((version, datetime.fromtimestamp(int(ts) / 1000, tz=UTC)))
    found.sort()
    out: list[tuple[int, datetime]] = []
    for version, at in found:
        later = at if not out or at > out[-1][1] else out[-1][1] + timedelta(milliseconds=1)
        out.append((version, later))
    return out


def oldest_readable(uri: str, storage_options: Mapping[str, str] | None = None) -> int:
    """The oldest version of the table a reader can load: 0 while the first commit is there,
    else the oldest checkpoint the log trim kept (``outbox.delta.log``: it keeps the checkpoint
    it cuts at and every commit after it)."""
    files = log.list_log(uri, storage_options)
    commits = {f.version for f in files if f.commit}
    if 0 in commits or not files:
        return 0
    checkpoints = log.complete_checkpoints(files)
    return min(checkpoints) if checkpoints else min(commits, default=0)


def _gone(what: str, uri: str, oldest: int, log_retention: float | None) -> HistoryGoneError:
    kept = (
        f"log_retention ({format_duration(log_retention)})"
        if log_retention is not None
        else "the log_retention setting"
    )
    return HistoryGoneError(
        f"{what} is before the history {uri} keeps: the oldest readable version is {oldest}",
        hint=f"read as of version {oldest} or later; {kept} sets how much history the table "
        "keeps (raise it to keep more)",
    )

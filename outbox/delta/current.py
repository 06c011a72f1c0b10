"""The one definition of a table's *current documents*, for every reader.

The table holds a row per document version and a mark row per watermark (``outbox.delta.versions``
says why). A reader that is not the library sees all of them, so the rule that makes documents of
rows is written once, here, in the two forms the readers need, which the tests prove equal on a
table taken through every state the layout passes through (tests/readers):

* ``current_sql``: the SQL text (a window query, valid in DataFusion, Spark and Databricks SQL,
  polars SQL and DuckDB) that the whole-table reads, the rescuer sweeps of both engines, the
  Spark views and ``outbox sql`` all run;
* ``current_rows``: the same rule over Arrow rows already read, for reads by id (the store's
  reads, ``Outbox.documents(ids)``): the rows of a few ids are found through the file id index and
  partition pruning, and folding them in Arrow costs less than planning a window query.

The rule::

    doc rows   : version > 0                      (mark rows have version 0, MARK_VERSION)
    newest     : per id, the doc row with the highest version
    watermark  : per (id, incarnation), the highest dispatched_seq over ALL its rows
                 (mark rows too; a null incarnation is one life of its own)
    documents  : newest, with dispatched_seq := the watermark of its life
                 (the store's, the dispatcher's view: include_deleted=True)
    current    : documents whose row is not a tombstone (``deleted`` true): every reader's view

Why the newest row decides a tombstone: a delete is a version like a save (it carries the
document's last messages, so the dispatcher must still see it); a re-created document's newer
version hides it again. A table without the ``deleted`` column (schema version 2) has no
tombstones, and ``has_deleted=False`` reads it without naming the column.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.durations import format_duration
from outbox.core.errors import HistoryGoneError, StoreError, ValidationError
from outbox.delta import log, reads
from outbox.delta.schema import DOCUMENT_SCHEMA, INCARNATION
from outbox.delta.table import deltalake, open_table, store_error

#: The ``version`` of a watermark's mark row (``outbox.delta.appends``); documents start at 1.
MARK_VERSION = 0
#: The tombstone column: true on the version that deletes its document (null or false: live).
DELETED = "deleted"
#: What a reader gets by default: the document columns, in the table's order.
DOCUMENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in DOCUMENT_SCHEMA)

_NULL_LIFE = "\x00"  # stands for a null incarnation in group keys (never a real token)


def has_deleted(schema: pa.Schema) -> bool:
    """True when a table (its Arrow schema) has the tombstone column."""
    return DELETED in schema.names


def output_columns(
    columns: Sequence[str] | None = None, *, include_deleted: bool = False
) -> list[str]:
    """The columns a reader returns: ``columns`` checked, or the document columns (and
    ``deleted`` when tombstones are included, so a reader can tell them)."""
    if columns is None:
        return [*DOCUMENT_COLUMNS, *([DELETED] if include_deleted else [])]
    if isinstance(columns, str):
        raise ValidationError(
            f"columns must be a list of column names, got the string {columns!r}",
            hint=f"pass columns=[{columns!r}]",
        )
    known = [*DOCUMENT_COLUMNS, DELETED]
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ValidationError(
            f"unknown document column(s) {', '.join(map(repr, unknown))}",
            hint=f"choose from {', '.join(known)}",
        )
    if not columns:
        raise ValidationError("columns names no column", hint="leave it out for every column")
    return list(dict.fromkeys(columns))


def current_sql(
    source: str,
    *,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
    has_deleted: bool = True,
) -> str:
    """The current documents of the rows in ``source`` (a table name, ``delta.`<uri>```, a
    ``delta_scan(...)`` call, or a parenthesised subquery with an alias), one row per id.

    ``columns``: the output columns (default: the document columns, plus ``deleted`` with
    ``include_deleted``); ``dispatched_seq`` is the life's watermark, ``deleted`` is never null.
    ``include_deleted``: keep tombstones (the store's and the dispatcher's view, so a deleted
    document's last messages still leave). ``has_deleted``: whether ``source`` has the ``deleted``
    column (a schema version 2 table has not, and has no tombstones).

    One statement, no engine-specific syntax (no ``<=>``, no ``QUALIFY``): the window functions
    group a null incarnation as one partition in every engine, as the rule wants.
    """
    select = ", ".join(
        _select(c, has_deleted) for c in output_columns(columns, include_deleted=include_deleted)
    )
    hidden = f" AND NOT coalesce({DELETED}, false)" if has_deleted and not include_deleted else ""
    return (
        f"SELECT {select}\n"
        "FROM (SELECT *,\n"
        "             row_number() OVER (PARTITION BY id ORDER BY version DESC) AS _rn,\n"
        f"             max(dispatched_seq) OVER (PARTITION BY id, {INCARNATION}) AS _ds\n"
        f"      FROM {source}) AS _v\n"
        f"WHERE _rn = 1 AND version > {MARK_VERSION}{hidden}"
    )


def _select(column: str, has_deleted: bool) -> str:
    if column == "dispatched_seq":
        return "_ds AS dispatched_seq"
    if column == DELETED:
        return f"coalesce({DELETED}, false) AS {DELETED}" if has_deleted else f"false AS {DELETED}"
    return column


def current_rows(table: pa.Table, *, include_deleted: bool = True) -> pa.Table:
    """``current_sql``'s rule over rows already read: one row per id, its highest version, with
    ``dispatched_seq`` the highest over the rows of that version's incarnation; tombstones
    dropped unless ``include_deleted``. ``table`` needs ``id``, ``version``, ``dispatched_seq``
    and ``incarnation`` (and ``deleted`` to drop tombstones, when the table has it); the other
    columns come from the chosen row, unchanged. Order: by id.

    ``include_deleted`` defaults to True here: the store's own reads (``versions.latest_rows``)
    must see a tombstone, whose last messages the dispatcher still sends."""
    if table.num_rows == 0:
        return table
    life = pc.fill_null(pc.cast(table[INCARNATION], pa.string()), _NULL_LIFE)
    keyed = table.append_column("_life", life)
    order = pc.sort_indices(keyed, sort_keys=[("id", "ascending"), ("version", "descending")])
    ids = keyed["id"].take(order).to_pylist()
    first = [int(order[0].as_py())]
    for n in range(1, len(ids)):
        if ids[n] != ids[n - 1]:
            first.append(int(order[n].as_py()))
    latest = keyed.take(pa.array(first, pa.int64()))
    if latest.num_rows == keyed.num_rows:  # one row per id: nothing to fold
        return _visible(table.take(pa.array(first, pa.int64())), include_deleted)
    highest = keyed.group_by(["id", "_life"], use_threads=False).aggregate(
        [("dispatched_seq", "max")]
    )
    most = {
        (i, life): int(ds)
        for i, life, ds in zip(
            highest["id"].to_pylist(),
            highest["_life"].to_pylist(),
            highest["dispatched_seq_max"].to_pylist(),
            strict=True,
        )
    }
    folded = [
        most[(i, life)]
        for i, life in zip(latest["id"].to_pylist(), latest["_life"].to_pylist(), strict=True)
    ]
    out = table.take(pa.array(first, pa.int64()))
    return _visible(
        out.set_column(
            out.schema.get_field_index("dispatched_seq"),
            out.schema.field("dispatched_seq"),
            pa.array(folded, out.schema.field("dispatched_seq").type),
        ),
        include_deleted,
    )


def _visible(latest: pa.Table, include_deleted: bool) -> pa.Table:
    """Without the ids whose newest row is a mark row (marks of a document deleted since, which
    the next fold removes: such an id holds no document), and without tombstones unless
    ``include_deleted``."""
    keep = pc.greater(latest["version"], MARK_VERSION)
    if not include_deleted and DELETED in latest.column_names:
        keep = pc.and_(keep, pc.invert(pc.fill_null(latest[DELETED], False)))
    if pc.all(keep).as_py() is not False:
        return latest
    return latest.filter(keep)


def project(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``table``'s ``columns`` in that order, ``deleted`` made never null (false when the table
    has no such column): what a reader of ``current_rows`` returns, the shape ``current_sql``
    returns."""
    out = []
    for c in columns:
        if c != DELETED:
            out.append(table[c])
        elif DELETED in table.column_names:
            out.append(pc.fill_null(table[DELETED], False))
        else:
            out.append(pa.array([False] * table.num_rows, pa.bool_()))
    return pa.Table.from_arrays(out, names=list(columns))


# --- reading them: now, or as of a version or a time ------------------------------------------

#: Ids per SQL query of an as-of read (``reads.scan`` says why reads are chunked).
SCAN_CHUNK = 5_000
#: A table version, a time (naive: UTC), or ISO 8601 text for a time.
AsOf = int | datetime | str
Run = Callable[[str], pa.Table]
Scan = Callable[[Sequence[str], list[str] | None], pa.Table]


def documents(
    run: Run,
    scan: Scan,
    schema: pa.Schema,
    *,
    ids: Sequence[str] | None = None,
    type: str | None = None,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
) -> pa.Table:
    """The current documents of one snapshot, ordered by id: ``run`` runs SQL over it (as
    ``t``), ``scan`` reads the rows of some ids (the store's chunked, pruned read), ``schema`` is
    its Arrow schema. With ``ids``: those ids' rows, folded by ``current_rows`` (what the store's
    ``read`` does); without: ``current_sql``. ``type`` filters on the document's newest row."""
    out = output_columns(columns, include_deleted=include_deleted)
    tombstones = has_deleted(schema)
    if ids is not None:
        wanted = _check_ids(ids)
        needed = [*out, "id", "version", "dispatched_seq", INCARNATION, "type", DELETED]
        read = [c for c in dict.fromkeys(needed) if c != DELETED or tombstones]
        docs = current_rows(scan(wanted, read), include_deleted=include_deleted)
        if type is not None:
            docs = docs.filter(pc.equal(docs["type"], type))
        return project(docs, out)
    inner = current_sql(
        "t",
        columns=list(dict.fromkeys([*out, "id", "type"])),
        include_deleted=include_deleted,
        has_deleted=tombstones,
    )
    where = "" if type is None else f" WHERE type = {reads.quote_ids([type])}"
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
        return reads.query(dt, sql, uri)

    def scan(wanted: Sequence[str], cols: list[str] | None) -> pa.Table:
        return reads.scan(run, wanted, cols, store.bucket, SCAN_CHUNK)

    schema = pa.schema(dt.schema().to_arrow())
    try:
        return documents(run, scan, schema, ids=ids, **options)
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

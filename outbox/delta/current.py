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

The readers themselves (now, or as of a version or a time) are ``outbox.delta.reads``'.

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

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.errors import ValidationError
from outbox.delta.schema import DELETED, DOCUMENT_SCHEMA, INCARNATION

#: The ``version`` of a watermark's mark row (``outbox.delta.appends``); documents start at 1.
MARK_VERSION = 0
#: What a reader gets by default: the document columns, in the table's order (``deleted`` only
#: with tombstones: a reader of the current documents has none).
DOCUMENT_COLUMNS: tuple[str, ...] = tuple(f.name for f in DOCUMENT_SCHEMA if f.name != DELETED)

_NULL_LIFE = "\x00"  # stands for a null incarnation in group keys (never a real token)


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

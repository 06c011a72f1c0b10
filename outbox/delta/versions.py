"""The versions layout (schema version 2): what a document *is* when the table holds several rows
of it.

A save appends the document's new version as a new row, and a watermark appends a *mark row*
(``version`` 0, ``MARK_VERSION``, holding only the mark in ``dispatched_seq``): nothing already in
the table is rewritten, so a commit's cost follows the documents it changes, not the table's size
(``outbox.delta.appends``). The upkeep folds superseded versions and mark rows away
(``outbox.delta.fold``). Between the two, a document is:

* its row with the **highest ``version``** (every save writes ``version + 1``, so versions are
  dense per document and the highest is the newest; a mark row is never it: an id whose rows are
  all mark rows holds no document), and
* ``dispatched_seq`` = the **highest ``dispatched_seq`` over its rows of that row's
  incarnation**: mark rows, the watermark each saved version carried from its read, and what a
  fold or an older writer raised in place.

Every reader applies this rule: the store's reads (``latest_rows``), the sweeps of both rescuer
engines (``pending_sql``, and its Spark twin), the planners' feed images, the checker. A
table written at schema version 1 holds one row per document, which the rule reads unchanged.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.errors import DuplicateRowsError
from outbox.delta.schema import DELETED, INCARNATION

#: The ``version`` of a watermark's mark row (``outbox.delta.appends``); documents start at 1.
MARK_VERSION = 0

_NULL_LIFE = "\x00"  # stands for a null incarnation in group keys (never a real token)


def latest_rows(table: pa.Table, *, include_deleted: bool = False) -> pa.Table:
    """One row per id: the highest version, with ``dispatched_seq`` the highest over the rows of
    that version's incarnation. ``table`` needs ``id``, ``version``, ``dispatched_seq`` and
    ``incarnation``; other columns come from the chosen row. Order: by id. An id whose newest
    row is a tombstone (``deleted``) holds no current document; ``include_deleted`` keeps it
    (the store's own view: its last messages must still leave)."""
    latest = _latest(table)
    if include_deleted or DELETED not in latest.column_names or latest.num_rows == 0:
        return latest
    return latest.filter(pc.invert(pc.fill_null(latest[DELETED], False)))


def _latest(table: pa.Table) -> pa.Table:
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
        return _documents(table.take(pa.array(first, pa.int64())))
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
    return _documents(
        out.set_column(
            out.schema.get_field_index("dispatched_seq"),
            out.schema.field("dispatched_seq"),
            pa.array(folded, out.schema.field("dispatched_seq").type),
        )
    )


def _documents(latest: pa.Table) -> pa.Table:
    """Without the ids whose newest row is a mark row (``MARK_VERSION``): marks of a document
    deleted since, which the next fold removes; such an id holds no document."""
    if pc.all(pc.greater(latest["version"], MARK_VERSION)).as_py() is not False:
        return latest
    return latest.filter(pc.greater(latest["version"], MARK_VERSION))


def pending_sql(columns: list[str]) -> str:
    """DataFusion SQL over table ``t``: the documents with messages not yet sent, as their latest
    rows with the folded ``dispatched_seq``. Only ids with some row pending are folded (a
    document whose every row has ``last_seq <= dispatched_seq`` cannot be pending: its latest
    row's ``last_seq`` is at most its own ``dispatched_seq``)."""
    cols = ", ".join("_ds AS dispatched_seq" if c == "dispatched_seq" else c for c in columns)
    return (
        f"SELECT {cols} FROM ("
        "SELECT *, row_number() OVER (PARTITION BY id ORDER BY version DESC) AS _rn, "
        f"max(dispatched_seq) OVER (PARTITION BY id, {INCARNATION}) AS _ds "
        "FROM t WHERE id IN (SELECT id FROM t WHERE last_seq > dispatched_seq)"
        ") AS v WHERE _rn = 1 AND last_seq > _ds"
    )


def duplicated(table: pa.Table) -> dict[str, int]:
    """Documents of ``table`` (rows with ``id`` and ``version``) whose version appears in more
    than one row: id -> that version (``outbox.delta.repair`` says how a table gets there)."""
    docs = table.filter(pc.greater(table["version"], MARK_VERSION))
    if docs.num_rows < 2:
        return {}
    counts = docs.group_by(["id", "version"], use_threads=False).aggregate([("version", "count")])
    twice = counts.filter(pc.greater(counts["version_count"], 1))
    return dict(zip(twice["id"].to_pylist(), twice["version"].to_pylist(), strict=True))


def damage_error(uri: str, doc_id: str, version: int) -> DuplicateRowsError:
    """The error of a save that would build on a copied version (nothing is written)."""
    return DuplicateRowsError(
        f"document {doc_id!r} has version {version} in more than one row of {uri} (two "
        "compactions of one version ran at once); nothing was written",
        hint="run `outbox maintain --repair` (one maintainer at a time), then save again",
    )

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

The rule is written once, in ``outbox.delta.current`` (its SQL text and its Arrow form, with
tombstones); the store's reads (``latest_rows``), the sweeps of both rescuer engines
(``pending_sql``, run as SQL by each), the Spark views and ``Outbox.documents`` use it. The
planners' feed images read the change feed, not rows, and keep their own twin of it. A table
written at schema version 1 holds one row per document, which the rule reads unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.errors import DuplicateRowsError
from outbox.delta import current

#: The ``version`` of a watermark's mark row (``outbox.delta.appends``); documents start at 1.
MARK_VERSION = current.MARK_VERSION


def latest_rows(table: pa.Table, *, include_deleted: bool = True) -> pa.Table:
    """One row per id: the highest version, with ``dispatched_seq`` the highest over the rows of
    that version's incarnation (``outbox.delta.current.current_rows``, the rule's Arrow form).
    ``table`` needs ``id``, ``version``, ``dispatched_seq`` and ``incarnation``; other columns
    come from the chosen row. Order: by id. Tombstones stay unless ``include_deleted`` is False:
    the store's reads must see a deleted document's last messages."""
    return current.current_rows(table, include_deleted=include_deleted)


def pending_sql(columns: Sequence[str], *, source: str = "t", has_deleted: bool = True) -> str:
    """SQL over the rows in ``source`` (DataFusion's ``t``; Spark's sweep passes its frame): the
    documents with messages not yet sent, as their latest rows with the folded
    ``dispatched_seq`` (``current.current_sql`` with tombstones: a deleted document's last
    messages are pending like any other). Only ids with some row pending are folded (a document
    whose every row has ``last_seq <= dispatched_seq`` cannot be pending: its latest row's
    ``last_seq`` is at most its own ``dispatched_seq``)."""
    wanted = list(dict.fromkeys([*columns, "last_seq", "dispatched_seq"]))
    rows = (
        f"(SELECT * FROM {source} WHERE id IN "
        f"(SELECT id FROM {source} WHERE last_seq > dispatched_seq)) AS _p"
    )
    documents = current.current_sql(
        rows, columns=wanted, include_deleted=True, has_deleted=has_deleted
    )
    return f"SELECT {', '.join(columns)} FROM ({documents}) AS _c WHERE last_seq > dispatched_seq"


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

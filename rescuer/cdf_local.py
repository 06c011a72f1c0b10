"""The local engine: delta-rs ``load_cdf`` into Arrow, planned with pyarrow (no JVM).

Why pyarrow and not polars for the planning: measured in ``benchmarks/rescuer.py``, pyarrow was
at least as fast at every feed size tried (the figures are in docs/rescuer.md, generated from
benchmarks/results/rescuer.json), and it is already a hard dependency. The polars version lives
in ``benchmarks/rescuer.py`` (``plan_polars``), which asserts both agree.

Feed failures are translated at this edge: delta-rs reports a vacuumed ``_change_data`` file as
pyarrow ``ArrowInvalid`` *while streaming*, and an expired log as ``DeltaError("Invalid table
version")``; both become ``FeedUnavailableError``, which makes the runner fall back to a sweep.
A commit file that does not parse is a damaged log (``StoreError`` naming the file and what to
do). Every other driver error (network, permissions) becomes ``EngineError``: the pass fails and
the next one retries the same window.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.errors import EngineError
from outbox.delta.log_check import damaged_log_error
from outbox.delta.versions import MARK_VERSION, pending_sql
from rescuer.planner import (
    FEED_COLUMNS,
    FeedWindow,
    PendingDocument,
    Plan,
    driver_errors,
    feed_unavailable,
    first_line,
    pending_from_rows,
    sweep_plan,
)

#: The signatures of "the history this window needs is gone", as delta-rs 1.6.6 reports them
#: (checked against a real table in tests/rescuer/test_errors.py): an expired or cleaned-up log
#: (``DeltaError: Invalid table version: N``), and a vacuumed ``_change_data`` file, which surfaces
#: while streaming as ``ArrowInvalid: ... Object at location <file> not found: No such file or
#: directory (os error 2)``. Nothing broader: a network or permission error is not missing
#: history, and a full sweep with a "FEED UNAVAILABLE" warning would hide it.
_GONE_LOG = "invalid table version"
_GONE_FILE = ("no such file or directory", "(os error 2)")


def history_gone(e: BaseException) -> bool:
    """True when ``e`` says the change feed's history is gone (vacuumed or expired)."""
    if isinstance(e, FileNotFoundError):
        return True
    text = str(e).lower()
    if _GONE_LOG in text or any(s in text for s in _GONE_FILE):
        return True
    return "object at location" in text and "not found" in text  # object stores' NotFound


def read_feed(delta_table: Any, uri: str, window: FeedWindow) -> pa.Table:
    """The feed rows over ``(window.start, window.latest]`` with the planning columns only."""
    from deltalake.exceptions import DeltaError

    try:
        reader = delta_table.load_cdf(
            starting_version=window.start + 1,
            ending_version=window.latest,
            columns=FEED_COLUMNS,
        )
        table = pa.RecordBatchReader.from_stream(reader).read_all()
    except (OSError, DeltaError, pa.ArrowException) as e:
        if history_gone(e):
            raise feed_unavailable(uri, window, e) from e
        damaged = damaged_log_error(uri, e, getattr(delta_table, "_storage_options", None))
        if damaged is not None:  # a damaged commit: the next pass would fail the same way
            raise damaged from e
        # The network, the disk, permissions, a bug in the reader: not vacuumed history. The
        # pass fails and the next one retries the same window; a sweep would not help.
        raise EngineError(
            f"reading the change feed of {uri} failed: {type(e).__name__}: {first_line(e)}",
            hint="check that the table's storage is reachable; the next pass retries the same "
            "window",
        ) from e
    return normalize(table)


#: The sweep: the same DataFusion query as ``DeltaDocumentStore.scan_pending`` (each pending
#: document as its latest version, with the folded watermark: ``outbox.delta.versions``).
SWEEP_SQL = pending_sql(["id", "last_seq", "dispatched_seq", "incarnation"])


def sweep_rows(delta_table: Any) -> pa.Table:
    """(id, last_seq, dispatched_seq, incarnation) of every pending row in the handle's snapshot.

    Read through DataFusion (``QueryBuilder``), like the store, not ``to_pyarrow_table(filters=)``:
    in deltalake 1.6.6 that path does not prune partitions, and once a Delta checkpoint exists its
    string statistics come back as ``string_view`` and filters break (docs/delta.md).
    """
    from deltalake import QueryBuilder

    reader = QueryBuilder().register("t", delta_table).execute(SWEEP_SQL)
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    return pa.table(
        {
            "id": pc.cast(table["id"], pa.string()),
            "last_seq": pc.cast(table["last_seq"], pa.int64()),
            "dispatched_seq": pc.cast(table["dispatched_seq"], pa.int64()),
            "incarnation": pc.cast(table["incarnation"], pa.string()),
        }
    )


def normalize(table: pa.Table) -> pa.Table:
    """delta-rs returns ``string_view`` and ``uint64``; some kernels refuse them, so cast."""
    return pa.table(
        {
            "id": pc.cast(table["id"], pa.string()),
            "version": pc.cast(table["version"], pa.int64()),
            "last_seq": pc.cast(table["last_seq"], pa.int64()),
            "dispatched_seq": pc.cast(table["dispatched_seq"], pa.int64()),
            "incarnation": pc.cast(table["incarnation"], pa.string()),
            "_change_type": pc.cast(table["_change_type"], pa.string()),
            "_commit_version": pc.cast(table["_commit_version"], pa.int64()),
        }
    )


_NO_LIFE = "\x00"  # a null incarnation, as a group key


def documents(images: pa.Table) -> pa.Table:
    """Per id, the document the images show (``rescuer.planner``, "The versions layout"): its
    life (the newest image's incarnation), its newest version's ``last_seq``, its watermark (the
    highest over that life's post-images), and whether a delete of that newest version came
    in a later commit (one commit that deletes and inserts it rewrote it). Columns: id,
    last_seq, dispatched_seq, incarnation, deleted."""
    empty = pa.table(
        {
            "id": pa.array([], pa.string()),
            "last_seq": pa.array([], pa.int64()),
            "dispatched_seq": pa.array([], pa.int64()),
            "incarnation": pa.array([], pa.string()),
            "deleted": pa.array([], pa.bool_()),
        }
    )
    if images.num_rows == 0:
        return empty
    life = pc.fill_null(images["incarnation"], _NO_LIFE)
    images = images.append_column("_life", life)
    is_delete = pc.equal(images["_change_type"], "delete")
    posts = images.filter(pc.invert(is_delete))
    if posts.num_rows == 0:
        return empty
    # the life: the newest document image's (a re-created document's new life wins over the
    # old; a mark row is no image of the document: a late mark of a deleted life names that one)
    docs = posts.filter(pc.greater(posts["version"], MARK_VERSION))
    if docs.num_rows == 0:
        return empty
    by_commit = docs.sort_by([("_commit_version", "ascending"), ("version", "ascending")])
    lives = by_commit.group_by("id", use_threads=False).aggregate([("_life", "last")])
    lives = lives.rename_columns(["id", "_doc_life"])
    ours = posts.join(lives, keys="id").filter(pc.equal(pc.field("_life"), pc.field("_doc_life")))
    # the newest version of that life, and the life's watermark
    by_version = ours.sort_by([("version", "ascending"), ("_commit_version", "ascending")])
    newest = by_version.group_by("id", use_threads=False).aggregate(
        [
            ("last_seq", "last"),
            ("version", "last"),
            ("_commit_version", "last"),
            ("incarnation", "last", pc.ScalarAggregateOptions(skip_nulls=False)),
            ("dispatched_seq", "max"),
            ("_life", "last"),
        ]
    )
    newest = newest.rename_columns(
        ["id", "last_seq", "version", "_commit", "incarnation", "dispatched_seq", "_life"]
    )
    deletes = images.filter(is_delete)
    gone: set[str] = set()
    if deletes.num_rows:
        hit = deletes.join(
            newest.select(["id", "version", "_commit", "_life"]), keys=["id"], right_suffix="_doc"
        )
        ended = hit.filter(
            pc.and_(
                pc.and_(
                    pc.equal(hit["_life"], hit["_life_doc"]),
                    pc.greater_equal(hit["version"], hit["version_doc"]),
                ),
                # later, not the same commit: a rewrite (a bucket replaced by ``outbox maintain
                # --repair``, an overwrite with a predicate) deletes and inserts in one commit
                pc.greater(hit["_commit_version"], hit["_commit"]),
            )
        )
        gone = set(ended["id"].to_pylist())
    deleted = pc.is_in(newest["id"], value_set=pa.array(sorted(gone), pa.string()))
    return pa.table(
        {
            "id": newest["id"],
            "last_seq": newest["last_seq"],
            "dispatched_seq": pc.cast(newest["dispatched_seq"], pa.int64()),
            "incarnation": newest["incarnation"],
            "deleted": deleted,
        }
    )


def _pending(docs: pa.Table) -> pa.Table:
    return docs.filter(
        pc.and_(pc.invert(docs["deleted"]), pc.greater(docs["last_seq"], docs["dispatched_seq"]))
    )


def plan_arrow(
    feed: pa.Table, window: FeedWindow
) -> tuple[int, int, int, tuple[PendingDocument, ...]]:
    """(change rows in window, ids changed in window, tail rows, pending) from a normalized feed."""
    version = feed["_commit_version"]
    in_window = pc.less_equal(version, window.end)
    change_rows = int(pc.sum(pc.cast(in_window, pa.int64())).as_py() or 0)
    tail_rows = feed.num_rows - change_rows
    window_rows = feed.filter(in_window)
    documents_changed = (
        int(pc.count_distinct(window_rows["id"]).as_py()) if window_rows.num_rows else 0
    )
    images = feed.filter(pc.not_equal(feed["_change_type"], "update_preimage"))
    candidates = _pending(
        documents(images.filter(pc.less_equal(images["_commit_version"], window.end)))
    )
    if candidates.num_rows == 0:
        return change_rows, documents_changed, tail_rows, ()
    if tail_rows == 0:
        current = candidates
    else:
        mine = images.filter(pc.is_in(images["id"], value_set=candidates["id"]))
        current = _pending(documents(mine))
    rows = zip(
        current["id"].to_pylist(),
        current["last_seq"].to_pylist(),
        current["dispatched_seq"].to_pylist(),
        current["incarnation"].to_pylist(),
        strict=True,
    )
    return change_rows, documents_changed, tail_rows, pending_from_rows(rows)


class LocalEngine:
    """delta-rs reads the feed and the table; planning runs in this process on Arrow."""

    name = "local"

    def __init__(self, *, storage_options: Mapping[str, str] | None = None) -> None:
        self._storage_options = dict(storage_options or {}) or None
        self._tables: dict[str, Any] = {}

    def _table(self, uri: str) -> Any:
        """One handle per table, refreshed incrementally (0.2 ms when nothing changed)."""
        from deltalake import DeltaTable

        dt: Any = self._tables.get(uri)
        if dt is None:
            with driver_errors(f"opening the table at {uri}"):
                dt = DeltaTable(uri, storage_options=self._storage_options)
            self._tables[uri] = dt
        else:
            with driver_errors(f"refreshing the table at {uri}"):
                dt.update_incremental()
        return dt

    def plan_feed(self, table_uri: str, window: FeedWindow) -> Plan:
        t0 = time.perf_counter()
        feed = read_feed(self._table(table_uri), table_uri, window)
        t1 = time.perf_counter()
        change_rows, documents, tail_rows, pending = plan_arrow(feed, window)
        t2 = time.perf_counter()
        return Plan(
            "feed",
            self.name,
            change_rows,
            documents,
            pending,
            tail_rows,
            {"read_s": t1 - t0, "plan_s": t2 - t1},
        )

    def plan_sweep(self, table_uri: str, version: int) -> Plan:
        t0 = time.perf_counter()
        dt = self._table(table_uri)
        moved = int(dt.version()) != version
        if moved:  # the table moved since the pass started: sweep the pass's snapshot
            try:
                with driver_errors(f"loading version {version} of {table_uri}"):
                    dt.load_as_version(version)
            except Exception:
                self._tables.pop(table_uri, None)  # the handle may be half-moved; reopen it
                raise
        try:
            with driver_errors(f"sweeping {table_uri} at version {version}"):
                rows = sweep_rows(dt)
        finally:
            if moved:  # the cached handle is behind now; reopen it next time
                self._tables.pop(table_uri, None)
        found = zip(
            rows["id"].to_pylist(),
            rows["last_seq"].to_pylist(),
            rows["dispatched_seq"].to_pylist(),
            rows["incarnation"].to_pylist(),
            strict=True,
        )
        return sweep_plan(self.name, found, time.perf_counter() - t0)

    def close(self) -> None:
        self._tables.clear()

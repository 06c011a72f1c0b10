"""Erasure: removing every copy of some documents from the table, its history and the queue
database (``outbox erase``; docs/erasure.md says what goes where and when, and what is out of
reach).

Three steps, each idempotent, recorded in a ledger (``outbox.app.erasure_sql``):

1. **Erase** (``erase``): per bucket, one MERGE deletes every row of the ids (document versions
   and mark rows; the fold's shape, ``outbox.delta.fold``: the commit's predicate names buckets,
   never an id), retried on a conflict, then the bucket is read again and the MERGE repeated
   while rows remain (a delta-rs MERGE can commit over a mark append it did not see,
   docs/delta.md). From that commit on, no reader of the current table sees the documents. Then
   the queue database is purged and a checkpoint written, which the log trim needs to pass the
   erase commit.
2. **Wait**: older versions still hold the rows (time travel, the change feed, the files the
   erase rewrote, its own change data with the full deleted rows) until the log trim passes the
   erase commit: ``log_retention`` after it, longer while a rescuer lags.
3. **Finish** (``advance``, called by every ``outbox maintain`` after its trim): once the oldest
   commit in the log is past the erase commit, check the table again (a late mark row is erased
   again, and the wait starts over), sweep the orphan data files (``outbox.delta.orphans``:
   a failed append's file), purge the queue database again and replace the ledger's id by its
   hash.

Pending messages: ``pending="drop"`` erases at once. ``"send"`` first deletes each document
through the library (``write_tombstones``: ``uow.delete``, so the tombstone races saves by the
optimistic rules), then sends what its tombstone carries (the dispatcher's own dispatch, as the
command worker does) and erases only the documents with nothing pending afterwards. A save that
lands between the erase's read and its tombstone makes the tombstone's commit fail; the erase
reads again and writes the tombstone over that save (its messages are sent with the rest). A
writer that read before the tombstone and commits after it gets ``ConcurrencyError``, so no
version can follow the tombstone unnoticed; only a new life can (``uow.create``, once the
tombstone's messages are sent): left for the next run while its own messages are pending at the
re-read after the send, else erased with the rest (docs/erasure.md).

Why one module: the finish step erases again with the very MERGE and re-read of the first step,
and both read the ledger's phases; the SQL side (ledger, purge) and the file side (trim, sweep)
are already apart (``erasure_sql``, ``outbox.delta.log``, ``outbox.delta.orphans``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa

from outbox.app import erasure_sql as ledger
from outbox.app.erasure_sql import ERASED, REQUESTED, Lives
from outbox.core.clock import Clock
from outbox.core.errors import ConcurrencyError, StoreError, ValidationError
from outbox.core.model import DocumentRow
from outbox.core.settings import Settings
from outbox.delta.appends import OPERATION_KEY
from outbox.delta.current import current_sql
from outbox.delta.log import _filesystem, list_log, oldest_commit
from outbox.delta.orphans import sweep_orphans
from outbox.delta.reads import in_list, quote_ids
from outbox.delta.schema import has_deleted
from outbox.delta.store import DeltaDocumentStore
from outbox.delta.table import store_error
from outbox.unit_of_work import Document, UnitOfWork

log = logging.getLogger("outbox.erase")

#: MERGE attempts per bucket before giving up (each conflict means another writer committed).
MAX_ATTEMPTS = 20
#: Rounds of MERGE + re-read per bucket (a round only repeats for rows a MERGE did not see).
MAX_ROUNDS = 10

Send = Callable[[Sequence[DocumentRow]], None]


@dataclass
class EraseReport:
    """What ``erase`` did (or, with ``dry_run``, would do). ``still_pending``: ids left for the
    next run because their messages could not all be sent. ``tombstoned``: ids this run deleted
    first (``pending="send"``); ``tombstone_conflicts``: saves that raced those tombstones."""

    ids: list[str] = field(default_factory=list)
    erased: list[str] = field(default_factory=list)
    still_pending: list[str] = field(default_factory=list)
    tombstoned: list[str] = field(default_factory=list)
    tombstone_conflicts: int = 0
    rows_removed: int = 0
    merges: int = 0
    conflicts: int = 0
    erased_version: int | None = None
    sql_rows_deleted: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_no_deletion_vectors(store: DeltaDocumentStore) -> None:
    """Refuse a table with deletion vectors (only another engine, e.g. Spark, enables them):
    deltalake's MERGE rewrites files, but a row a deletion vector hides stays in its file, where
    no trim or sweep of ours would ever look for it."""
    dt = store.delta_table
    protocol = dt.protocol()
    features = set(protocol.reader_features or []) | set(protocol.writer_features or [])
    config = dt.metadata().configuration or {}
    if "deletionVectors" in features or config.get("delta.enableDeletionVectors") == "true":
        raise StoreError(
            f"the table {store.uri} uses deletion vectors (enabled by another engine): rows they "
            "hide stay in their files, out of an erasure's reach",
            hint="in Spark, run `REORG TABLE delta.`<uri>` APPLY (PURGE)` and set "
            "'delta.enableDeletionVectors' = false (and drop the feature), then erase again",
        )


def select_ids(
    store: DeltaDocumentStore,
    *,
    ids: Sequence[str] = (),
    where: str | None = None,
    sql_url: str | None = None,
) -> list[str]:
    """The ids to erase: ``ids`` as given (each must have rows in the table, or an erasure still
    requested in the ledger at ``sql_url``: one cut short after its MERGE, which a second run
    completes), or the current documents matching ``where``: SQL over ``current_sql``, the rows
    every reader shows (``dispatched_seq`` the life's watermark, ``deleted`` never null), with
    tombstones, so a document deleted but not erased yet is found too."""
    store.refresh()
    if where is not None:
        schema = pa.schema(store.delta_table.schema().to_arrow())
        current = current_sql("t", include_deleted=True, has_deleted=has_deleted(schema))
        sql = f"SELECT id FROM ({current}) AS _c WHERE ({where})"
        try:
            found = store._query(sql)
        except StoreError as e:
            raise ValidationError(
                f"--where {where!r} is not a valid condition on the documents: {e}",
                hint="a SQL condition on the table's columns, e.g. --where \"type = 'user'\"",
            ) from e
        return sorted({str(i) for i in found["id"].to_pylist()})
    wanted = list(dict.fromkeys(ids))
    present = set(_rows_of(store, wanted)["id"].to_pylist()) if wanted else set()
    unknown = [i for i in wanted if i not in present]
    if unknown and sql_url is not None and ledger.ledger_ready(sql_url):
        open_rows = ledger.ledger(sql_url, store.table_id, open_only=True)
        requested = {str(r["doc_id"]) for r in open_rows if r["phase"] == REQUESTED}
        unknown = [i for i in unknown if i not in requested]
    if unknown:
        shown = ", ".join(repr(i) for i in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ValidationError(
            f"no document {shown} in {store.uri}: nothing was erased",
            hint="check the ids (`outbox erase --status` lists erasures already done)",
        )
    return wanted


def _rows_of(store: DeltaDocumentStore, ids: Sequence[str]) -> pa.Table:
    """Every row of ``ids`` (versions and mark rows): id, bucket, incarnation, last_seq."""
    if not ids:
        return pa.table({"id": pa.array([], pa.string())})
    parts = []
    for start in range(0, len(ids), ledger.CHUNK):
        chunk = ids[start : start + ledger.CHUNK]
        buckets = in_list(store.bucket(i) for i in chunk)
        parts.append(
            store._query(
                "SELECT id, bucket, incarnation, last_seq FROM t "
                f"WHERE bucket IN ({buckets}) AND id IN ({quote_ids(chunk)})"
            )
        )
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def lives_of(store: DeltaDocumentStore, ids: Sequence[str]) -> list[Lives]:
    """Each id's lives as the table shows them (the messages the purge looks for)."""
    rows = _rows_of(store, ids)
    tops: dict[str, dict[str | None, int]] = {i: {} for i in ids}
    for doc_id, inc, last in zip(
        rows["id"].to_pylist(),
        rows["incarnation"].to_pylist() if rows.num_rows else [],
        rows["last_seq"].to_pylist() if rows.num_rows else [],
        strict=False,
    ):
        life = tops.setdefault(str(doc_id), {})
        life[inc] = max(life.get(inc, 0), int(last or 0))
    return [Lives(doc_id, top) for doc_id, top in tops.items()]


def erase(
    store: DeltaDocumentStore,
    *,
    sql_url: str,
    ids: Sequence[str],
    clock: Clock,
    pending: str = "send",
    send: Send | None = None,
    settings: Settings | None = None,
    dry_run: bool = False,
) -> EraseReport:
    """Erase ``ids`` (``select_ids``) from the current table and the queue database (steps 1 of
    the module docstring); ``advance`` finishes the job. With ``pending="send"``, each document
    is deleted first (``write_tombstones``, a unit of work with ``settings``), then ``send``
    sends its tombstone's rows' pending messages."""
    if pending not in ("send", "drop"):
        raise ValidationError(f"--pending must be send or drop, not {pending!r}")
    if pending == "send" and (send is None or settings is None):
        raise ValidationError("erasing with pending='send' needs the settings and a sender")
    check_no_deletion_vectors(store)
    report = EraseReport(ids=list(ids), dry_run=dry_run)
    if dry_run:
        _, rows = store.read(list(ids))
        report.still_pending = sorted(i for i, r in rows.items() if r.has_pending)
        return report
    ledger.record(sql_url, store.table_id, ids, clock.now())
    if pending == "send" and send is not None and settings is not None:
        write_tombstones(store, settings, ids, clock, report)
        _, rows = store.read(list(ids))  # the tombstones, carrying what is still unsent
        waiting = sorted(i for i, r in rows.items() if r.has_pending)
        if waiting:
            send([rows[i] for i in waiting])
        _, again = store.read(list(ids))  # also a create of an id since its tombstone was sent
        report.still_pending = sorted(i for i, r in again.items() if r.has_pending)
    chosen = [i for i in ids if i not in set(report.still_pending)]
    if not chosen:
        return report
    lives = lives_of(store, chosen)
    report.erased_version = erase_rows(store, chosen, report, clock)
    report.sql_rows_deleted = ledger.purge(sql_url, store.table_id, lives)
    _checkpoint(store)
    ledger.mark(
        sql_url, store.table_id, chosen, ERASED, now=clock.now(), version=report.erased_version
    )
    report.erased = list(chosen)
    log.info(
        "erased %d document(s) from %s at version %s (%d rows); the old files go once the log "
        "trim passes that version (`outbox erase --status`)",
        len(chosen),
        store.uri,
        report.erased_version,
        report.rows_removed,
    )
    return report


def write_tombstones(
    store: DeltaDocumentStore,
    settings: Settings,
    ids: Sequence[str],
    clock: Clock,
    report: EraseReport,
) -> None:
    """Delete each of ``ids`` still live through the library (``uow.delete``: a tombstone with
    the document's per-document application transaction, carrying its unsent messages), a unit
    of work per chunk. A save committed after the unit of work read a document makes the commit
    fail with ``ConcurrencyError`` (nothing written); the chunk is read again and its tombstones
    follow that save, up to ``MAX_ATTEMPTS`` times. Ids already tombstoned or gone are skipped."""
    for start in range(0, len(ids), ledger.CHUNK):
        chunk = list(ids[start : start + ledger.CHUNK])
        for _attempt in range(MAX_ATTEMPTS):
            uow = UnitOfWork(store, settings, clock)  # no dispatch on commit: the erase sends
            docs = _live_documents(uow, chunk)
            for doc in docs.values():
                uow.delete(doc)
            try:
                uow.commit()
            except ConcurrencyError:
                report.tombstone_conflicts += 1
                log.info("a save raced the erase's tombstones in %s; reading again", store.uri)
                continue
            report.tombstoned += sorted(docs)
            break
        else:
            raise StoreError(
                f"saves to {store.uri} raced the erase's tombstones {MAX_ATTEMPTS} times in a "
                "row: nothing was erased",
                hint="stop the writers saving these documents, then run `outbox erase` again",
            )


def _live_documents(uow: UnitOfWork, ids: Sequence[str]) -> dict[str, Document]:
    """The documents of ``ids`` a tombstone must follow (absent: tombstoned or gone), read in
    ``uow``. A function of its own so the race test can save between this read and the commit,
    as tests/erasure/test_late_marks.py steps in around ``_merge_delete``."""
    return uow.get_many(ids)


def erase_rows(
    store: DeltaDocumentStore, ids: Sequence[str], report: EraseReport, clock: Clock
) -> int:
    """Delete every row of ``ids``, bucket by bucket, until none is left; the version of the
    last erase commit (the table's version when nothing was left to delete)."""
    from deltalake import CommitProperties

    by_bucket: dict[int, list[str]] = {}
    for doc_id in ids:
        by_bucket.setdefault(store.bucket(doc_id), []).append(doc_id)
    version = store.refresh()
    props = CommitProperties(custom_metadata={OPERATION_KEY: "erase"})
    with store._lock:
        for bucket, members in sorted(by_bucket.items()):
            for _round in range(MAX_ROUNDS):
                if not _remaining(store, bucket, members):
                    break
                removed = _merge_delete(store, bucket, members, props, report=report, clock=clock)
                report.rows_removed += removed
                report.merges += 1
                version = store.refresh()
            else:
                raise StoreError(
                    f"erasing from bucket {bucket} of {store.uri}: rows kept coming back after "
                    f"{MAX_ROUNDS} rounds",
                    hint="stop the writers saving these documents, then run `outbox erase` again",
                )
    return version


def _remaining(store: DeltaDocumentStore, bucket: int, ids: Sequence[str]) -> int:
    store.refresh()
    found = store._query(
        f"SELECT count(*) AS n FROM t WHERE bucket = {bucket} AND id IN ({quote_ids(ids)})"
    )
    return int(found["n"][0].as_py())


def _merge_delete(
    store: DeltaDocumentStore,
    bucket: int,
    ids: Sequence[str],
    props: Any,
    *,
    report: EraseReport,
    clock: Clock,
) -> int:
    """One MERGE deleting the rows of ``ids`` in ``bucket``, retried on a commit conflict.

    It joins on the ids' hashes (the ledger's ``sha256(table_id|id)``), not the ids: delta-rs
    turns a join on a source column into a filter of the source's values (``id = 'x'``, or the
    range of the ids) and writes it into the commit's ``commitInfo``, which would keep the id
    in the log; on a hash of the target column it writes only the bucket."""
    from deltalake.exceptions import CommitFailedError

    table_id = store.table_id
    source = pa.table(
        {
            "h": pa.array([ledger.hashed(table_id, i) for i in ids], pa.string()),
            "bucket": pa.array([bucket] * len(ids), pa.int32()),
        }
    )
    hashed_id = f"encode(sha256(concat({_sql_literal(table_id + '|')}, t.id)), 'hex')"
    for attempt in range(MAX_ATTEMPTS):
        try:
            metrics = (
                store.delta_table.merge(
                    source,
                    predicate=f"t.bucket IN ({in_list([bucket])}) AND t.bucket = s.bucket "
                    f"AND {hashed_id} = s.h",
                    source_alias="s",
                    target_alias="t",
                    streamed_exec=False,
                    commit_properties=props,
                )
                .when_matched_delete()
                .execute()
            )
            return int(metrics.get("num_target_rows_deleted", 0))
        except Exception as e:
            if not isinstance(e, CommitFailedError) and "concurrent" not in str(e).lower():
                raise store_error(f"erasing from {store.uri} failed", e) from e
            report.conflicts += 1
            log.info("erase of bucket %d met a concurrent commit (%s); retrying", bucket, e)
            clock.sleep(min(1.0, 0.01 * 2**attempt))
            store.refresh()
    raise StoreError(
        f"erasing from bucket {bucket} of {store.uri} lost {MAX_ATTEMPTS} commit races in a row",
        hint="run `outbox erase` again when the writers are quieter",
    )


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _checkpoint(store: DeltaDocumentStore) -> None:
    """A checkpoint at the erase commit: the trim keeps a checkpoint and every commit after it,
    so it can pass the erase commit only once a newer checkpoint exists."""
    with store._lock:
        try:
            store.refresh()
            store.delta_table.create_checkpoint()
        except Exception as e:
            raise store_error(f"writing a checkpoint of {store.uri} failed", e) from e


def advance(
    store: DeltaDocumentStore,
    clock: Clock,
    sql_url: str,
    retention_seconds: float,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Finish every erasure of the table whose erase commit the log trim has passed (step 3 of
    the module docstring); what it did. Called by ``outbox maintain`` after its trim."""
    if not ledger.ledger_ready(sql_url):
        return {}
    open_rows = ledger.ledger(sql_url, store.table_id, open_only=True)
    if not open_rows:
        return {}
    options = storage_options if storage_options is not None else store._storage_options
    oldest = oldest_commit(list_log(store.uri, fs=_filesystem(store.uri, options)))
    passed = {
        str(r["doc_id"]): int(r["erased_version"])
        for r in open_rows
        if r["phase"] == ERASED
        and r["erased_version"] is not None
        and oldest is not None
        and oldest > int(r["erased_version"])
    }
    out: dict[str, Any] = {"open": len(open_rows), "finished": 0, "erased_again": 0}
    if not passed or oldest is None:
        return out
    late = sorted(set(_rows_of(store, list(passed))["id"].to_pylist()))
    if late:  # a mark row committed over the erase: erase again, and wait again
        report = EraseReport(ids=late)
        version = erase_rows(store, late, report, clock)
        _checkpoint(store)
        ledger.mark(sql_url, store.table_id, late, ERASED, now=clock.now(), version=version)
        out["erased_again"] = len(late)
    touched = _touched_since(store, passed, oldest, skip=set(late))
    for doc_id, version in touched.items():  # rows came and went after the erase: wait for
        ledger.mark(sql_url, store.table_id, [doc_id], ERASED, now=clock.now(), version=version)
    out["waiting_again"] = len(touched)
    done = [i for i in passed if i not in set(late) and i not in touched]
    if not done:
        return out
    out["orphan_files_deleted"] = len(
        sweep_orphans(
            store.uri,
            now=clock.now(),
            retention=timedelta(seconds=retention_seconds),
            storage_options=options,
        )
    )
    ledger.purge(sql_url, store.table_id, [Lives(i, {}) for i in done])
    ledger.mark(sql_url, store.table_id, done, ledger.DONE, now=clock.now())
    ledger.checkpoint_wal(sql_url)
    out["finished"] = len(done)
    log.info(
        "finished %d erasure(s) of %s: no file holds their rows any more", len(done), store.uri
    )
    return out


def _touched_since(
    store: DeltaDocumentStore, erased: Mapping[str, int], oldest: int, *, skip: set[str]
) -> dict[str, int]:
    """The ids whose rows a retained commit after their erase added or removed (a late mark row
    that a fold has removed since: its file goes only when the trim passes that fold), each with
    the newest such commit; read from the change feed of the retained log."""
    wanted = [i for i in erased if i not in skip]
    if not wanted:
        return {}
    start = max(oldest, min(erased[i] for i in wanted) + 1)
    if start > store.refresh():
        return {}
    try:
        where = f"id IN ({quote_ids(wanted)})"  # two columns: Spark's files fail the rest
        reader = store.delta_table.load_cdf(
            starting_version=start, columns=["id", "_commit_version"], predicate=where
        )
        changes = reader.read_all()
    except Exception as e:
        raise store_error(f"reading the change feed of {store.uri} failed", e) from e
    newest: dict[str, int] = {}
    if changes.num_rows:
        for doc_id, version in zip(
            changes["id"].to_pylist(), changes["_commit_version"].to_pylist(), strict=True
        ):
            if doc_id in erased and int(version) > erased[doc_id]:
                newest[doc_id] = max(newest.get(doc_id, 0), int(version))
    return newest


def status(store: DeltaDocumentStore, sql_url: str) -> list[dict[str, Any]]:
    """The ledger's rows of the table, each open one with what it waits for."""
    if not ledger.ledger_ready(sql_url):
        return []
    rows = ledger.ledger(sql_url, store.table_id)
    oldest = oldest_commit(list_log(store.uri, storage_options=store._storage_options))
    for row in rows:
        if row["phase"] == REQUESTED:
            row["waiting_for"] = (
                "the messages its tombstone carries to be sent (`outbox erase --id` again)"
            )
        elif row["phase"] == ERASED:
            row["waiting_for"] = (
                f"the log trim to pass version {row['erased_version']} (oldest commit kept: "
                f"{oldest}; `outbox maintain` after log_retention)"
            )
        else:
            row["waiting_for"] = None
    return rows

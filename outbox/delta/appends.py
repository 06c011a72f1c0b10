"""The two writes of the versions layout, both plain appends: a save's new document versions, and
watermark rows.

Why appends (docs/delta.md, "The versions layout", has the numbers): a delta-rs MERGE scans every
file of the buckets its source touches (its early filter is the source's id range, which random
ids span), so a save MERGE cost grew with the table, 10x from 10,000 to 1,000,000 documents; an
append writes the new rows and one log entry, whatever the table's size.

Why an append keeps every rule of the optimistic save (measured on deltalake 1.6.6 and read in
delta-spark's conflict checker; tests/write_path/test_versions.py pins each):

* **Two saves of one document conflict.** Each save carries one application transaction per
  document (a Delta ``txn`` action, app id ``outbox:doc:<id>``); delta-rs fails a commit when a
  commit after its snapshot carries the same app id ("Concurrent transaction failed"), and the
  store's retry then re-reads and reports ``ConcurrencyError``. Saves of different documents never
  conflict, whatever their buckets.
* **A save conflicts with any commit that removed data meanwhile** (a DELETE, a Spark MERGE, a
  fold): delta-rs treats an append as having read the table. The store retries it on the new
  snapshot, whose re-check sees what the other writer did. A compaction (``dataChange`` false) is
  no conflict.
* **Spark sees our saves.** delta-rs writes no ``isBlindAppend`` into ``commitInfo``, and
  delta-spark reads an absent flag as "not blind", so a Spark MERGE that read a document fails
  against our concurrent save of it.

A watermark is an append too: a *mark row* (``version`` 0, no state, no messages) whose
``dispatched_seq`` is the mark. The versions rule (``outbox.delta.versions``) already reads a
document's watermark as the highest over its life's rows, so a mark row needs no reader of its
own, never conflicts with anything (it only raises), and rides in a save's append for free. The
fold (``outbox.delta.fold``) folds mark rows into the document's row.

The application transactions never enter the table's state. The conflict above comes only from
the commits after a save's snapshot, whose files delta-rs reads back to compare their app ids with
the save's own (``check_for_updated_application_transaction_ids_that_current_txn_depends_on``); no
reader here asks the snapshot for an app id's version. So each transaction carries ``lastUpdated``
0 (``EXPIRED_MS``): every checkpoint leaves it out as older than
``delta.setTransactionRetentionDuration`` (``schema.TXN_RETENTION``, which the table keeps at a
day for other writers' idempotent streams), and a checkpoint's size and a table's open time no
longer follow the documents saved within the retention (docs/delta.md, "What the table's state
holds"). The log trim bounds how long the commits themselves stay, always longer than a save's
race (its refresh, re-check and append).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa

from outbox.delta import schema as S
from outbox.delta.group_commit import DocumentWrite
from outbox.delta.versions import MARK_VERSION

#: The app id prefix of a save's per-document application transactions.
TXN_PREFIX = "outbox:doc:"
#: Their ``lastUpdated``: the epoch, so no checkpoint keeps them (the module docstring says why
#: that is safe). Any retention shorter than 56 years expires them.
EXPIRED_MS = 0
#: ``commitInfo`` metadata naming what an outbox commit did (``outbox.delta.log`` readers).
OPERATION_KEY = "outbox.operation"


def document_rows(writes: Sequence[DocumentWrite], bucket: Callable[[str], int]) -> pa.Table:
    """The new version of each written document, one row each."""
    return S.table_from_rows(
        ((w.row, bucket(w.row.id)) for w in writes),
        states=[w.state_json for w in writes],
        extra={},
    )


def mark_rows(
    marks: Mapping[str, tuple[int, str | None]], bucket: Callable[[str], int], now: datetime
) -> pa.Table:
    """One mark row per document: id -> (seq sent, the life it was sent from)."""
    ids = list(marks)
    n = len(ids)
    columns: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.string()),
        "type": pa.array([""] * n, pa.string()),
        "version": pa.array([MARK_VERSION] * n, pa.int64()),
        "state": pa.array([""] * n, pa.string()),
        "last_seq": pa.array([0] * n, pa.int64()),
        "dispatched_seq": pa.array([marks[i][0] for i in ids], pa.int64()),
        "outbox": pa.array([[]] * n, S.DOCUMENT_SCHEMA.field("outbox").type),
        "updated_at": pa.array([now] * n, S.TS),
        "bucket": pa.array([bucket(i) for i in ids], pa.int32()),
        S.INCARNATION: pa.array([marks[i][1] for i in ids], pa.string()),
        S.DELETED: pa.array([False] * n, pa.bool_()),  # a mark is no tombstone
    }
    return pa.table(columns, schema=S.DOCUMENT_SCHEMA)


def append(
    dt: Any,
    rows: pa.Table,
    *,
    operation: str,
    documents: Iterable[tuple[str, int]] = (),
) -> None:
    """Append ``rows`` in one commit, with an application transaction per saved document
    (id, new version), born expired (``EXPIRED_MS``). Raises what deltalake raises (the store
    translates it)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    txns = [Transaction(TXN_PREFIX + d, v, last_updated=EXPIRED_MS) for d, v in documents]
    write_deltalake(
        dt,
        rows,
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata={OPERATION_KEY: operation}, app_transactions=txns or None
        ),
    )

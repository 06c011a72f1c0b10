"""The table's state follows what is live, not the last day's saves (issue 47).

Each save carries an application transaction per document, and the fold and compaction remove
every file a save appended. Before, both stayed in the table's state (the checkpoints): a day of
transactions (``delta.setTransactionRetentionDuration``) and a week of tombstones, so a writer of
new documents grew every checkpoint with each one. Now a save's transactions are written already
expired (``outbox.delta.appends.EXPIRED_MS``) and a tombstone is kept fifteen minutes
(``delta.deletedFileRetentionDuration``). What these tests pin:

* the two-saves rule does not need the state: a save racing another save of its document still
  loses when a checkpoint, holding neither transaction, was written between them;
* a checkpoint holds none of the saves' transactions, however many documents were saved, while
  another writer's transaction (a Spark stream's ``txnAppId``) is still kept for the day;
* a tombstone older than the retention leaves the next checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from outbox.app.facade import Outbox
from outbox.core.errors import ConcurrencyError
from outbox.delta import schema as S
from outbox.delta import table
from outbox.delta.appends import TXN_PREFIX
from outbox.delta.store import DocumentWrite
from tests.write_path.test_versions import _next, _two_writers


def _checkpoint(uri: str) -> dict[str, list[dict[str, Any]]]:
    """Write a checkpoint at the table's current version; its ``txn`` and ``remove`` rows."""
    dt = DeltaTable(uri)
    dt.create_checkpoint()
    path = Path(uri) / "_delta_log" / f"{dt.version():020d}.checkpoint.parquet"
    table = pq.read_table(path, columns=["txn", "remove"])
    return {c: [r for r in table.column(c).to_pylist() if r] for c in ("txn", "remove")}


def test_a_save_racing_another_save_of_its_document_loses_across_a_checkpoint(
    workspace: Path,
) -> None:
    """``second`` refreshes and re-checks version 1 of ``a``; before it appends, ``first`` saves
    version 2 and a checkpoint is written that holds no application transaction (they are born
    expired). ``second``'s append still fails: delta-rs compares its app ids with the commits
    after its snapshot, read from their files, not with the snapshot's state. Its retry re-reads
    and reports ``ConcurrencyError``; one version 2 exists."""
    first, second = _two_writers(workspace)
    uri = first.uri
    seen: dict[str, Any] = {}
    try:
        rows = [first.read(["a"])[1]["a"], second.read(["a"])[1]["a"]]
        real = second._append_documents

        def after_the_other_save(writes: Any, current: int) -> None:
            if not seen:  # the first attempt only: the retry must see the table as it is
                first.save([DocumentWrite(_next(rows[0]), 1, first.version())])
                seen.update(_checkpoint(uri))
            real(writes, current)

        second._append_documents = after_the_other_save  # type: ignore[method-assign]
        with pytest.raises(ConcurrencyError, match="was changed since it was read"):
            second.save([DocumentWrite(_next(rows[1]), 1, second.version())])
        assert seen["txn"] == []  # the checkpoint between them held no transaction
        assert second.commit_retries == 1  # the append lost, then the re-check refused it
        versions = first.delta_table.to_pyarrow_table(columns=["version"])["version"].to_pylist()
        assert sorted(versions) == [1, 2]
    finally:
        first.close()
        second.close()


def test_a_checkpoint_holds_no_transaction_of_a_save_however_many(ob: Outbox) -> None:
    """500 documents created and 50 changed, in 11 commits: the checkpoint after them holds no
    ``outbox:doc:`` transaction. Another writer's transaction with a current ``lastUpdated``
    (what a Spark stream writing idempotently leaves) is still in it: the table's retention is
    the day it was."""
    for n in range(10):
        with ob.unit_of_work() as uow:
            for i in range(50):
                uow.create(f"d{n}-{i}", type="T").send("Created", {}, destination="q")
    with ob.unit_of_work() as uow:
        for doc in uow.get_many([f"d0-{i}" for i in range(50)]).values():
            doc.send("Changed", {}, destination="q")
    write_deltalake(
        ob.store.uri,
        S.table_from_rows([], extra={}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction("spark-stream", 7, last_updated=int(time.time() * 1000))]
        ),
    )
    dt = DeltaTable(ob.store.uri)
    assert dt.metadata().configuration[S.TXN_RETENTION_PROPERTY] == "interval 1 days"
    txns = _checkpoint(ob.store.uri)["txn"]
    assert [t["appId"] for t in txns if t["appId"].startswith(TXN_PREFIX)] == []
    assert [(t["appId"], t["version"]) for t in txns] == [("spark-stream", 7)]


def _remove(uri: str, path: str, age_s: float) -> None:
    """Commit a removal of ``path`` dated ``age_s`` ago, as the fold or compaction would have
    committed it then (the checkpoint writer keeps a tombstone by this date, against the wall
    clock: the only way to age one without waiting)."""
    dt = DeltaTable(uri)
    action = {
        "remove": {
            "path": path,
            "deletionTimestamp": int((time.time() - age_s) * 1000),
            "dataChange": False,
            "extendedFileMetadata": True,
            "partitionValues": {"bucket": "0"},
            "size": 1000,
        }
    }
    entry = Path(uri) / "_delta_log" / f"{dt.version() + 1:020d}.json"
    entry.write_text(json.dumps(action) + "\n")


def test_a_tombstone_older_than_the_retention_leaves_the_checkpoint(workspace: Path) -> None:
    """The table is created with ``delta.deletedFileRetentionDuration`` fifteen minutes: a removal
    committed twenty minutes ago is gone from the next checkpoint, a recent one is in it (dated
    an hour ahead, so no pause of a busy machine can age it past the retention before the
    checkpoint).
    With Delta's default week, both would stay, and a writer of new documents would grow every
    checkpoint by 16 tombstones a commit for a week."""
    uri = str(workspace / "documents")
    workspace.mkdir(parents=True)
    table.create_table(uri, buckets=4, storage_options=None, table_id=None)
    _remove(uri, "bucket=0/old.parquet", age_s=20 * 60)
    _remove(uri, "bucket=0/young.parquet", age_s=-3600)
    kept = [r["path"] for r in _checkpoint(uri)["remove"]]
    assert kept == ["bucket=0/young.parquet"]
    config = DeltaTable(uri).metadata().configuration
    assert config[S.TOMBSTONE_RETENTION_PROPERTY] == S.TOMBSTONE_RETENTION

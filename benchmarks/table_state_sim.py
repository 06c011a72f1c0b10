"""``benchmarks.table_state``'s ``candidates`` and ``day`` parts: the ways a save could carry its
two-saves check side by side, and a day of a busy writer's table state without waiting a day.

* ``candidates``: raw deltalake calls on one table each (the product's rows and partitioning, no
  outbox code in the way), ``commits`` appends of 100 new documents each, then a checkpoint:
  commit p50, the checkpoint's bytes and application transactions, the table's open time; two
  writers appending disjoint new documents from one snapshot, ``pairs`` times (a conflict there
  is a false one); and whether the later of two saves of one document from one snapshot fails,
  for an update and for two creations of one id (it must, both times):

  - ``before``: an application transaction per document, ``lastUpdated`` the time of the save
    (the layout before issue 47), the table's retention a day;
  - ``expired`` (chosen): the same transactions with ``lastUpdated`` 0, the retention a day;
  - ``short_retention``: ``lastUpdated`` the time of the save, the table's retention a minute
    (what a Spark stream's idempotent writes on the table would then also get);
  - ``per_bucket``: one transaction per bucket the commit touches instead of per document;
  - ``updates_only``: transactions only for documents past their first version (creations
    carry none).

* ``day``: a day of application transactions and tombstones through deltalake's own checkpoint
  writer, in rounds of ``commits`` commit files. The commit files are written directly (what a
  writer of new documents leaves in the log, scaled: each carries ``per_commit`` app ids and 16
  removed files per 100 of them, as the fold and compaction remove every file a save appends;
  ``lastUpdated`` and ``deletionTimestamp`` run from a day ago to now over the rounds); after
  each round deltalake writes a checkpoint and the log is trimmed before the previous one
  (``outbox.delta.log.trim_log``). Per round: the checkpoint's bytes, its transaction and
  tombstone rows, the time to write it and to open the table. ``chosen`` has the table
  properties ``outbox migrate`` sets and expired transactions; ``before`` has a day of
  transactions and Delta's week of tombstones, and stops once its checkpoint passes
  ``BEFORE_CAP_BYTES`` (it would reach gigabytes).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

BUCKETS = 16
DOCS_PER_COMMIT = 100
#: Files a commit of 100 new documents appends (one per bucket), each later removed again.
REMOVES_PER_100 = 16
DAY_MS = 24 * 3600 * 1000
BEFORE_CAP_BYTES = 64 * 1024 * 1024
TXN_PROPERTY = "delta.setTransactionRetentionDuration"
TOMBSTONE_PROPERTY = "delta.deletedFileRetentionDuration"

CANDIDATES: dict[str, dict[str, Any]] = {
    "before": {"txns": "document", "expired": False, "retention": "interval 1 days"},
    "expired": {"txns": "document", "expired": True, "retention": "interval 1 days"},
    "short_retention": {"txns": "document", "expired": False, "retention": "interval 1 minutes"},
    "per_bucket": {"txns": "bucket", "expired": True, "retention": "interval 1 days"},
    "updates_only": {"txns": "updates", "expired": True, "retention": "interval 1 days"},
}


def _bucket(doc_id: str) -> int:
    return zlib.crc32(doc_id.encode()) % BUCKETS


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1) if values else float("nan")


def _rows(ids: list[str], version: int) -> pa.Table:
    from benchmarks.doc_table import _rows as rows

    return rows(ids, version)


def _txns(how: dict[str, Any], docs: list[tuple[str, int]]) -> list[Any]:
    """The application transactions a commit of ``docs`` (id, new version) carries."""
    from deltalake import Transaction

    stamp = 0 if how["expired"] else int(time.time() * 1000)
    if how["txns"] == "bucket":
        keys = sorted({f"outbox:bucket:{_bucket(d)}" for d, _ in docs})
        return [Transaction(k, 1, last_updated=stamp) for k in keys]
    if how["txns"] == "updates":
        docs = [(d, v) for d, v in docs if v > 1]
    return [Transaction(f"outbox:doc:{d}", v, last_updated=stamp) for d, v in docs]


def _append(target: Any, how: dict[str, Any], docs: list[tuple[str, int]]) -> None:
    from deltalake import CommitProperties, write_deltalake

    versions = {v for _, v in docs}
    assert len(versions) == 1, "one version per commit here"
    rows = _rows([d for d, _ in docs], versions.pop())
    txns = _txns(how, docs)
    props = CommitProperties(app_transactions=txns or None)
    write_deltalake(target, rows, mode="append", commit_properties=props)


def _new_table(uri: str, how: dict[str, Any]) -> None:
    from deltalake import write_deltalake

    write_deltalake(
        uri,
        _rows([f"seed-{i}" for i in range(BUCKETS * 4)], 1),
        partition_by=["bucket"],
        configuration={
            "delta.enableChangeDataFeed": "true",
            TXN_PROPERTY: how["retention"],
        },
    )


def _checkpoint_rows(uri: str) -> dict[str, int]:
    """The newest checkpoint's bytes and its ``add``, ``remove`` and ``txn`` rows."""
    log = Path(uri) / "_delta_log"
    newest = max(log.glob("*.checkpoint*.parquet"), key=lambda p: p.name)
    table = pq.read_table(newest, columns=["add", "remove", "txn"])
    out = {c: table.num_rows - table.column(c).null_count for c in ("add", "remove", "txn")}
    return {"bytes": newest.stat().st_size, **out}


def _open_ms(uri: str, times: int = 5) -> float:
    from deltalake import DeltaTable

    DeltaTable(uri)  # the first open also loads the process's caches: not the table's cost
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        DeltaTable(uri)
        samples.append(time.perf_counter() - t0)
    return _ms(samples)


def _race(root: Path, how: dict[str, Any], *, creation: bool) -> bool:
    """Whether the later of two saves of one document, both from one snapshot, fails."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    uri = str(root / f"race-{uuid.uuid4().hex[:8]}")
    _new_table(uri, how)
    version = 1
    if not creation:
        _append(uri, how, [("a", 1)])
        version = 2
    doc = "n" if creation else "a"
    first, second = DeltaTable(uri), DeltaTable(uri)
    _append(first, how, [(doc, version)])
    try:
        _append(second, how, [(doc, version)])
    except CommitFailedError:
        return True
    finally:
        shutil.rmtree(uri, ignore_errors=True)
    return False


def _pairs(root: Path, how: dict[str, Any], pairs: int) -> dict[str, Any]:
    """Two writers append 100 new documents each (disjoint) from one snapshot, ``pairs`` times:
    how often the later one fails (every such failure is a false conflict)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    uri = str(root / "pairs")
    _new_table(uri, how)
    conflicts = 0
    for p in range(pairs):
        first, second = DeltaTable(uri), DeltaTable(uri)
        _append(first, how, [(f"p{p}-a{i}", 1) for i in range(DOCS_PER_COMMIT)])
        try:
            _append(second, how, [(f"p{p}-b{i}", 1) for i in range(DOCS_PER_COMMIT)])
        except CommitFailedError:
            conflicts += 1
    shutil.rmtree(uri, ignore_errors=True)
    return {"pairs": pairs, "conflicts": conflicts, "rate": round(conflicts / max(pairs, 1), 3)}


def run_candidates(root: Path, commits: int, pairs: int) -> dict[str, Any]:
    from deltalake import DeltaTable

    out: dict[str, Any] = {"commits": commits, "documents_per_commit": DOCS_PER_COMMIT}
    for name, how in CANDIDATES.items():
        uri = str(root / name)
        _new_table(uri, how)
        dt = DeltaTable(uri)
        latencies = []
        for c in range(commits):
            docs = [(f"c{c}-{i}", 1) for i in range(DOCS_PER_COMMIT)]
            t0 = time.perf_counter()
            _append(dt, how, docs)
            latencies.append(time.perf_counter() - t0)
        DeltaTable(uri).create_checkpoint()
        out[name] = {
            "commit_p50_ms": _ms(latencies),
            "checkpoint": _checkpoint_rows(uri),
            "open_ms": _open_ms(uri),
            "two_writers": _pairs(root, how, pairs),
            "racing_updates_conflict": _race(root, how, creation=False),
            "racing_creations_conflict": _race(root, how, creation=True),
        }
        shutil.rmtree(uri, ignore_errors=True)
        print("candidate", name, json.dumps(out[name]), flush=True)
    return out


# --- a day of state, in rounds ------------------------------------------------------------------


def _write_commit(
    log: Path, version: int, first_id: int, app_ids: int, *, lu: int, deleted_at: int
) -> None:
    """One commit file: ``app_ids`` transactions (``lastUpdated`` ``lu``) and the tombstones of
    the files 16 such saves per 100 documents would have appended (removed at ``deleted_at``)."""
    txn = (
        '{{"txn":{{"appId":"outbox:doc:sim-{n}","version":1,"lastUpdated":' + str(lu) + "}}}}"
    ).format
    removes = app_ids * REMOVES_PER_100 // DOCS_PER_COMMIT
    remove = (
        '{{"remove":{{"path":"bucket={b}/part-00001-sim-{n}-c000.zstd.parquet",'
        '"deletionTimestamp":' + str(deleted_at) + ',"dataChange":false,'
        '"extendedFileMetadata":true,"partitionValues":{{"bucket":"{b}"}},"size":9000}}}}'
    ).format
    info = json.dumps({"commitInfo": {"timestamp": deleted_at, "operation": "WRITE"}})
    lines = [info]
    lines += [txn(n=n) for n in range(first_id, first_id + app_ids)]
    lines += [remove(b=n % BUCKETS, n=n) for n in range(first_id, first_id + removes)]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def _day_table(uri: str, properties: dict[str, str]) -> None:
    from deltalake import write_deltalake

    write_deltalake(
        uri,
        _rows([f"live-{i}" for i in range(1_000)], 1),
        partition_by=["bucket"],
        configuration={"delta.enableChangeDataFeed": "true", **properties},
    )


def simulate_day(
    root: Path,
    name: str,
    properties: dict[str, str],
    *,
    expired: bool,
    rounds: int,
    commits: int,
    per_commit: int,
    cap_bytes: int | None = None,
) -> dict[str, Any]:
    from deltalake import DeltaTable

    from outbox.delta.log import trim_log

    uri = str(root / f"day-{name}")
    _day_table(uri, properties)
    log = Path(uri) / "_delta_log"
    start = int(time.time() * 1000) - DAY_MS
    version, app_ids = DeltaTable(uri).version(), 0
    samples: list[dict[str, Any]] = []
    for r in range(rounds):
        for _ in range(commits):
            at = start + DAY_MS * (app_ids + per_commit) // (rounds * commits * per_commit)
            version += 1
            _write_commit(log, version, app_ids, per_commit, lu=0 if expired else at, deleted_at=at)
            app_ids += per_commit
        t0 = time.perf_counter()
        DeltaTable(uri).create_checkpoint()
        written = time.perf_counter() - t0
        sample = {
            "round": r + 1,
            "app_ids": app_ids,
            "checkpoint": _checkpoint_rows(uri),
            "checkpoint_write_ms": round(written * 1000, 1),
            "open_ms": _open_ms(uri, 3),
        }
        samples.append(sample)
        print("day", name, json.dumps(sample), flush=True)
        trim_log(uri, now=_far_future(), retention=_zero(), needed=None)
        if cap_bytes is not None and sample["checkpoint"]["bytes"] > cap_bytes:
            break
    shutil.rmtree(uri, ignore_errors=True)
    return {
        "properties": properties,
        "transactions_expired": expired,
        "app_ids": app_ids,
        "rounds": len(samples),
        "samples": samples,
    }


def _far_future() -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(days=2)


def _zero() -> Any:
    from datetime import timedelta

    return timedelta(0)


def run_day(root: Path, rounds: int, commits: int, per_commit: int) -> dict[str, Any]:
    """The chosen state properties with expired transactions over the whole day; the layout
    before until its checkpoint passes ``BEFORE_CAP_BYTES``."""
    from outbox.delta.schema import STATE_PROPERTIES

    chosen = simulate_day(
        root,
        "chosen",
        dict(STATE_PROPERTIES),
        expired=True,
        rounds=rounds,
        commits=commits,
        per_commit=per_commit,
    )
    before = simulate_day(
        root,
        "before",
        {TXN_PROPERTY: "interval 1 days"},
        expired=False,
        rounds=rounds,
        commits=commits,
        per_commit=per_commit,
        cap_bytes=BEFORE_CAP_BYTES,
    )
    return {
        "app_ids_per_day": rounds * commits * per_commit,
        "commits_per_round": commits,
        "app_ids_per_commit": per_commit,
        "tombstones_per_100_app_ids": REMOVES_PER_100,
        "chosen": chosen,
        "before": before,
    }

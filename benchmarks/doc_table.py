"""The document table at scale (issue 31): what a 100-document commit costs as the table grows.

    python -m benchmarks.doc_table            # results/doc_table.json (10k, 100k, 1M documents)
    python -m benchmarks.doc_table --quick    # 10k and 100k, fewer commits, shorter runs
    python -m benchmarks.doc_table --smoke    # 1k, one commit, one writer process

In one run:

* ``candidates`` (per size): the layouts issue 31 asked to evaluate, each driven by raw
  deltalake calls so each is measured on its own terms (no outbox code in the way), on the same
  tables and the same random documents: commit latency (p50 of ``commits`` commits, each changing
  100 random documents) and the bytes each commit wrote (data files, change-data files and the
  log entry, read from the commit's own log entry):

  - ``in_place``: one file per bucket (what ``outbox maintain`` left before issue 31), an
    update MERGE as the save did: every file holding a changed row is rewritten (copy-on-write);
  - ``in_place_small_files``: the same MERGE over files sorted by id and capped at
    ``SMALL_FILE_ROWS`` rows, with the ids as a literal list so delta-rs could prune by id range;
  - ``versions_merge``: the new versions inserted by an insert-only MERGE (the optimistic check
    is the join on (id, version)) over the same sorted files: nothing is rewritten, but the
    MERGE still scans the buckets it touches;
  - ``versions_append_txn``: the new versions appended, with one application transaction per
    document (what the store does, ``outbox.delta.appends``);
  - ``floor_append``: the same append without the transactions: the changed rows and a log
    entry, no check at all. ``floor_changed_rows_bytes`` is the 100 rows as one Parquet file.

* ``outbox`` (per size), ``writers``, ``txn_state`` and ``disk``: the product itself
  (``benchmarks.doc_table_outbox`` says what each measures).

Bytes are the files each commit added, as the log records them, plus the log entry itself.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import statistics
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import doc_table_outbox as P
from benchmarks.common import add_output_options, percentile, save

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
#: one size: a second repeats the same steps (at 5k a bucket's rows still fit one small file)
SMOKE_SIZES = (1_000,)
BUCKETS = 16
CHANGED = 100  # documents per commit
SMALL_FILE_ROWS = 2_000
COMMITS = {"full": 10, "quick": 5, "smoke": 1}
#: The four-writer part: table size and commits per writer (a smoke run: one writer process a
#: round, each round's steps once; every spawned interpreter costs seconds of imports); the
#: disk part: seconds (a smoke run: one commit, one sample) and the table's documents.
WRITERS = {"full": (100_000, 25), "quick": (10_000, 10), "smoke": (1_000, 1)}
WRITER_PROCESSES = {"full": 4, "quick": 4, "smoke": 1}
DISK_SECONDS = {"full": 600.0, "quick": 60.0, "smoke": 0.0}
DISK_DOCS = {"full": P.DISK_DOCS, "quick": P.DISK_DOCS, "smoke": 1_000}
TXN_IDS = {"full": 1_000_000, "quick": 100_000, "smoke": 1_000}


def _bucket(doc_id: str) -> int:
    return zlib.crc32(doc_id.encode()) % BUCKETS


def _rows(ids: list[str], version: int) -> pa.Table:
    """Rows of the product's shape: a small JSON state and one message in the outbox."""
    from outbox.core.model import DocumentRow, OutboxMessage
    from outbox.delta import schema as S

    docs = []
    for i in ids:
        msg = OutboxMessage(
            seq=version,
            message_id=uuid.uuid4().hex,
            destination="shipments",
            type="ShipmentStatusChanged",
            body=json.dumps({"status": "in-transit", "at": "2026-11-26T00:00:00Z"}),
        )
        state = {"status": "in-transit", "carrier": "acme", "ref": uuid.uuid4().hex}
        docs.append(
            (
                DocumentRow(
                    i, "Shipment", version, state, version, version - 1, [msg], incarnation="0" * 32
                ),
                _bucket(i),
            )
        )
    return S.table_from_rows(docs, extra={})


def _commit_bytes(root: Path, version: int) -> dict[str, int]:
    entry = root / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines() if line]
    data = sum(a["add"]["size"] for a in actions if "add" in a)
    cdc = sum(a["cdc"]["size"] for a in actions if "cdc" in a)
    log = entry.stat().st_size
    return {"data": data, "cdc": cdc, "log": log, "total": data + cdc + log}


def _make_table(root: Path, ids: list[str], *, sorted_small: bool) -> None:
    from deltalake import DeltaTable, write_deltalake

    table = _rows(ids, 1)
    if sorted_small:
        table = table.sort_by([("bucket", "ascending"), ("id", "ascending")])
    write_deltalake(
        str(root),
        table,
        partition_by=["bucket"],
        configuration={"delta.enableChangeDataFeed": "true"},
        target_file_size=SMALL_FILE_ROWS * 160 if sorted_small else None,
    )
    if not sorted_small:
        DeltaTable(str(root)).optimize.compact()  # one file per bucket, as `outbox maintain`


def _merge(
    root: Path, sample: list[str], version: int, *, insert_only: bool, id_list: bool
) -> None:
    from deltalake import DeltaTable

    dt = DeltaTable(str(root))
    source = _rows(sample, version)
    buckets = ", ".join(str(b) for b in sorted({_bucket(i) for i in sample}))
    ids = (" AND t.id IN (" + ", ".join(f"'{i}'" for i in sample) + ")") if id_list else ""
    on = f"t.bucket IN ({buckets}){ids} AND t.bucket = s.bucket AND t.id = s.id"
    if insert_only:
        on += " AND t.version >= s.version"
    merger = dt.merge(source, predicate=on, source_alias="s", target_alias="t", streamed_exec=False)
    if not insert_only:
        merger = merger.when_matched_update_all()
    merger.when_not_matched_insert_all().execute()


def _append(root: Path, sample: list[str], version: int, *, txn: bool) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    props = None
    if txn:  # what the store's save does: an application transaction per document
        props = CommitProperties(
            app_transactions=[Transaction(f"outbox:doc:{i}", version) for i in sample]
        )
    write_deltalake(str(root), _rows(sample, version), mode="append", commit_properties=props)


def _floor_bytes(sample: list[str]) -> int:
    buf = io.BytesIO()
    pq.write_table(_rows(sample, 2), buf)
    return len(buf.getvalue())


CANDIDATES: dict[str, dict[str, Any]] = {
    "in_place": {"sorted_small": False, "insert_only": False, "id_list": False},
    "in_place_small_files": {"sorted_small": True, "insert_only": False, "id_list": True},
    "versions_merge": {"sorted_small": True, "insert_only": True, "id_list": True},
    "versions_append_txn": {"sorted_small": False, "append": True, "txn": True},
    "floor_append": {"sorted_small": False, "append": True},
}


def run_candidates(root: Path, size: int, commits: int, rng: random.Random) -> dict[str, Any]:
    ids = [f"doc-{i:09d}" for i in range(size)]
    samples = [rng.sample(ids, CHANGED) for _ in range(commits)]
    out: dict[str, Any] = {"floor_changed_rows_bytes": _floor_bytes(samples[0])}
    for name, how in CANDIDATES.items():
        table = root / f"{name}-{size}"
        _make_table(table, ids, sorted_small=how["sorted_small"])
        from deltalake import DeltaTable

        latencies, written = [], []
        for n, sample in enumerate(samples):
            t0 = time.perf_counter()
            if how.get("append"):
                _append(table, sample, n + 2, txn=bool(how.get("txn")))
            else:
                _merge(table, sample, n + 2, insert_only=how["insert_only"], id_list=how["id_list"])
            latencies.append(time.perf_counter() - t0)
            written.append(_commit_bytes(table, DeltaTable(str(table)).version())["total"])
        out[name] = {
            "commit_p50_ms": round(statistics.median(latencies) * 1000, 1),
            "commit_p90_ms": round(percentile(latencies, 90) * 1000, 1),
            "bytes_per_commit": int(statistics.median(written)),
            "bytes_over_changed_rows": round(
                statistics.median(written) / out["floor_changed_rows_bytes"], 1
            ),
        }
        shutil.rmtree(table, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k, fewer commits")
    add_output_options(parser)
    args = parser.parse_args(argv)
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = SMOKE_SIZES if args.smoke else QUICK_SIZES if args.quick else SIZES
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-doc-table-"))
    rng = random.Random(31)
    try:
        data: dict[str, Any] = {"sizes": {}, "changed_per_commit": CHANGED, "buckets": BUCKETS}
        for size in sizes:
            entry: dict[str, Any] = {
                "candidates": run_candidates(root, size, COMMITS[kind], rng),
                "outbox": P.run_outbox(root / f"outbox-{size}", size, COMMITS[kind], rng),
            }
            data["sizes"][str(size)] = entry
            print(size, json.dumps(entry), flush=True)
            shutil.rmtree(root / f"outbox-{size}", ignore_errors=True)
        docs, commits = WRITERS[kind]
        data["writers"] = P.run_writers(root / "writers", docs, commits, WRITER_PROCESSES[kind])
        print("writers", json.dumps(data["writers"]), flush=True)
        data["txn_state"] = P.run_txn_state(root / "txn", TXN_IDS[kind])
        print("txn_state", json.dumps(data["txn_state"]), flush=True)
        data["disk"] = P.run_disk(root / "disk", DISK_SECONDS[kind], rng, DISK_DOCS[kind])
        print("disk", json.dumps({k: v for k, v in data["disk"].items() if k != "samples"}))
        path = save(args, "doc_table", data)
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

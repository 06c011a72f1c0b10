"""The document table at scale (issue 31): what a 100-document commit costs as the table grows.

    python -m benchmarks.doc_table            # results/doc_table.json (10k, 100k, 1M documents)
    python -m benchmarks.doc_table --quick    # 10k and 100k, fewer commits
    python -m benchmarks.doc_table --smoke    # 1k and 5k, two commits each

Two parts, in one run:

* ``candidates``: the layouts issue 31 asked to evaluate, each driven by raw deltalake calls so
  each is measured on its own terms (no outbox code in the way), on the same tables and the same
  random documents. Per size: commit latency (p50 of ``commits`` commits, each changing 100
  random documents) and the bytes each commit wrote (data files, change-data files and the log
  entry, read from the commit's own log entry):

  - ``in_place``: one file per bucket (what ``outbox maintain`` left before issue 31), an
    update MERGE as the save did: every file holding a changed row is rewritten (copy-on-write);
  - ``in_place_small_files``: the same MERGE over files sorted by id and capped at
    ``SMALL_FILE_ROWS`` rows, with the ids as a literal list so delta-rs prunes files by their
    id range;
  - ``versions_appended``: the log-structured layout: an insert-only MERGE of the new versions
    (the optimistic check is the join on (id, version)) over the same sorted files, with the
    literal id list; nothing is rewritten;
  - ``floor``: the 100 changed rows written as one Parquet file (their bytes) and a plain
    append of them (its latency): no check, no change-data file.

* ``outbox``: the same commits through the product (``Outbox.unit_of_work``, ``get_many`` then
  save; the layout the store writes), plus its reads: ``get_many`` of 100, ``scan_pending`` (what
  ``outbox status`` and the rescuer's sweep read), a rescuer feed pass over the commits.

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

from benchmarks.common import add_output_options, percentile, save

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
SMOKE_SIZES = (1_000, 5_000)
BUCKETS = 16
CHANGED = 100  # documents per commit
SMALL_FILE_ROWS = 2_000
COMMITS = {"full": 10, "quick": 5, "smoke": 2}


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


def _append(root: Path, sample: list[str], version: int) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(root), _rows(sample, version), mode="append")


def _floor_bytes(sample: list[str]) -> int:
    buf = io.BytesIO()
    pq.write_table(_rows(sample, 2), buf)
    return len(buf.getvalue())


CANDIDATES: dict[str, dict[str, Any]] = {
    "in_place": {"sorted_small": False, "insert_only": False, "id_list": False},
    "in_place_small_files": {"sorted_small": True, "insert_only": False, "id_list": True},
    "versions_appended": {"sorted_small": True, "insert_only": True, "id_list": True},
    "floor_append": {"sorted_small": True, "append": True},
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
                _append(table, sample, n + 2)
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
            data["sizes"][str(size)] = {
                "candidates": run_candidates(root, size, COMMITS[kind], rng)
            }
            print(size, json.dumps(data["sizes"][str(size)]["candidates"]))
        path = save(args, "doc_table", data)
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

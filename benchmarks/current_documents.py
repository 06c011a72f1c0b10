"""Current-documents reads (issue 44 item 1): ``Outbox.documents`` beside the same read done by
hand with deltalake, in the same run, on a table with unfolded versions and mark rows.

    python -m benchmarks.current_documents                 # 1,000,000 documents (the lead's run)
    python -m benchmarks.current_documents --quick         # 20,000 documents
    python -m benchmarks.current_documents --smoke         # 200 documents, every step once
    python -m benchmarks.current_documents --docs 100000   # any size

Two reads, each timed for ours and by hand, alternating, on the same snapshot:

* **100 ids** (new random ids each round, the same for both): ``ob.documents(ids)`` (partition
  pruning, the file id index, the ids' rows folded in Arrow) against a user's DataFusion query
  (deltalake's ``QueryBuilder``): the window query over ``SELECT * FROM t WHERE id IN (...)``.
  The first call of ours reads every file's ids once (the index is cold): reported apart.
* **the whole table**: ``ob.documents()`` (the window query, ordered by id) against the window
  query by hand, not ordered.

The goal: each within 1.5x of the hand read (``ratio`` = ours / hand, of the p50s). Both reads
return the same documents, which the run checks. The table: every document at version 1, half of
them at version 2, and a mark row for a third of them, in a few large appends (so the files are
what a table between two folds holds, not one file per commit).

A full run writes benchmarks/results/current_documents.json; ``--quick`` and ``--smoke`` write
into a fresh temporary folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import add_output_options, percentile, save
from outbox.app.facade import Outbox
from outbox.core.clock import SystemClock
from outbox.core.model import bucket_of
from outbox.core.settings import Settings
from outbox.delta import schema as S
from outbox.delta.store import DeltaDocumentStore

log = logging.getLogger("benchmarks.current_documents")

BUCKETS = 16
IDS = 100
GOAL = 1.5
#: Rows per append while building the table.
CHUNK = 100_000

#: The window query a user writes by hand (docs/readers.md's rule, not our generator's text).
HAND = (
    "SELECT id, type, version, state, last_seq, _ds AS dispatched_seq, outbox, updated_at, "
    "bucket, incarnation FROM (SELECT *, "
    "row_number() OVER (PARTITION BY id ORDER BY version DESC) AS _rn, "
    "max(dispatched_seq) OVER (PARTITION BY id, incarnation) AS _ds FROM {source}) AS v "
    "WHERE _rn = 1 AND version > 0"
)


def _rows(ids: list[str], lives: dict[str, str], version: int, now: Any) -> pa.Table:
    n = len(ids)
    mark = version == 0
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "type": pa.array(["" if mark else "Order"] * n, pa.string()),
            "version": pa.array([version] * n, pa.int64()),
            "state": pa.array(
                ["" if mark else f'{{"n":{version},"total":{i % 997}}}' for i in range(n)],
                pa.string(),
            ),
            "last_seq": pa.array([0 if mark else version] * n, pa.int64()),
            "dispatched_seq": pa.array([1 if mark else 0] * n, pa.int64()),
            "outbox": pa.array([[]] * n, S.DOCUMENT_SCHEMA.field("outbox").type),
            "updated_at": pa.array([now] * n, S.TS),
            "bucket": pa.array([bucket_of(i, BUCKETS) for i in ids], pa.int32()),
            S.INCARNATION: pa.array([lives[i] for i in ids], pa.string()),
            S.DELETED: pa.array([False] * n, pa.bool_()),
        },
        schema=S.DOCUMENT_SCHEMA,
    )


def build(uri: str, docs: int) -> list[str]:
    """The table: ``docs`` documents at version 1, half at 2, a mark row for a third."""
    from deltalake import write_deltalake

    DeltaDocumentStore.create(uri, buckets=BUCKETS)
    ids = [uuid.uuid4().hex for _ in range(docs)]
    lives = {i: uuid.uuid4().hex for i in ids}
    now = SystemClock().now()
    plan = [(ids, 1), (ids[::2], 2), (ids[::3], 0)]
    for chosen, version in plan:
        for start in range(0, len(chosen), CHUNK):
            part = chosen[start : start + CHUNK]
            write_deltalake(uri, _rows(part, lives, version, now), mode="append")
    return ids


def _by_hand_ids(uri: str, ids: list[str]) -> pa.Table:
    from deltalake import DeltaTable, QueryBuilder

    quoted = ", ".join(f"'{i}'" for i in ids)
    source = f"(SELECT * FROM t WHERE id IN ({quoted})) AS r"
    reader = QueryBuilder().register("t", DeltaTable(uri)).execute(HAND.format(source=source))
    return pa.RecordBatchReader.from_stream(reader).read_all()


def _by_hand_all(uri: str) -> pa.Table:
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(uri)).execute(HAND.format(source="t"))
    return pa.RecordBatchReader.from_stream(reader).read_all()


def _same(ours: pa.Table, hand: pa.Table) -> None:
    key = ["id", "version", "dispatched_seq", "state"]
    a = sorted(tuple(r[k] for k in key) for r in ours.select(key).to_pylist())
    b = sorted(tuple(r[k] for k in key) for r in hand.select(key).to_pylist())
    if a != b:
        raise SystemExit(f"the reads disagree: {len(a)} rows ours, {len(b)} by hand")


def _ms(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 3), "max_ms": round(max(ms), 3)}


def _compare(ours: list[float], hand: list[float]) -> dict[str, Any]:
    o, h = _ms(ours), _ms(hand)
    ratio = round(o["p50_ms"] / h["p50_ms"], 3) if h["p50_ms"] else float("nan")
    return {"ours": o, "by_hand": h, "ratio": ratio, "within_goal": ratio <= GOAL}


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _race(ours: Any, hand: Any, rounds: int, check: Any) -> dict[str, Any]:
    """``ours(n)`` and ``hand(n)`` ``rounds`` times each, alternating which goes first; ``check``
    (n, our table, the hand table) after each round."""
    times: dict[str, list[float]] = {"ours": [], "hand": []}
    for n in range(rounds):
        runs = [("ours", ours), ("hand", hand)]
        got = {}
        for name, fn in runs if n % 2 == 0 else runs[::-1]:
            took, got[name] = _timed(lambda fn=fn, n=n: fn(n))
            times[name].append(took)
        check(n, got["ours"], got["hand"])
    return _compare(times["ours"], times["hand"])


def bench(base: Path, docs: int, rounds: int, whole_rounds: int) -> dict[str, Any]:
    uri = str(base / "ws" / "documents")
    t0 = time.perf_counter()
    ids = build(uri, docs)
    built_s = time.perf_counter() - t0
    settings = Settings(workspace=base / "ws", buckets=BUCKETS, compact_every=0)
    ob = Outbox(settings, DeltaDocumentStore(uri), clock=SystemClock())
    rng = random.Random(44)
    chosen = [rng.sample(ids, IDS) for _ in range(rounds + 1)]

    def whole(n: int, mine: pa.Table, by_hand: pa.Table) -> None:
        if n == 0:
            _same(mine, by_hand)
            if mine.num_rows != docs:
                raise SystemExit(f"{mine.num_rows} documents read, {docs} written")

    try:
        first_s, _ = _timed(lambda: ob.documents(chosen[-1]))  # the cold file id index
        by_ids = _race(
            lambda n: ob.documents(chosen[n]),
            lambda n: _by_hand_ids(uri, chosen[n]),
            rounds,
            lambda _n, mine, by_hand: _same(mine, by_hand),
        )
        by_ids["first_call_ms"] = round(first_s * 1000, 3)
        log.info("100 ids: %s", by_ids)
        all_docs = _race(
            lambda _n: ob.documents(), lambda _n: _by_hand_all(uri), whole_rounds, whole
        )
        log.info("whole table: %s", all_docs)
    finally:
        ob.close()
    return {
        "sizes": {"documents": docs, "rows": docs + (docs + 1) // 2 + (docs + 2) // 3},
        "build_s": round(built_s, 1),
        "ids_100": by_ids,
        "whole_table": all_docs,
        "ratio_ids": by_ids["ratio"],
        "ratio_whole_table": all_docs["ratio"],
        "goal": GOAL,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="20,000 documents")
    ap.add_argument("--docs", type=int, default=None, help="documents in the table")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the 100-id read")
    add_output_options(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    docs = args.docs or (200 if args.smoke else 20_000 if args.quick else 1_000_000)
    rounds = args.rounds or (2 if args.smoke else 30)
    whole_rounds = 2 if args.smoke else 5
    base = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    try:
        data = {"quick": args.quick, **bench(base, docs, rounds, whole_rounds)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    path = save(args, "current_documents", data)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

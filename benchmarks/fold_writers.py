"""A fold beside four writers (issue 45, P16): commits a second with an ``outbox maintain``
folding every second against the same writers alone, and whether any due bucket starves.

    python -m benchmarks.fold_writers            # 100,000 documents, 4 x 25 commits, 2 pairs
    python -m benchmarks.fold_writers --quick    # 10,000 documents, 4 x 10, 1 pair
    python -m benchmarks.fold_writers --smoke    # 1,000 documents, 1 x 1, 1 pair

Each pair is ``benchmarks.doc_table_outbox.run_writers`` on a fresh table: four writer
processes, each changing 100 random documents of its own quarter per unit of work (one message
each), first alone, then with a fold of every bucket with anything to fold once a second
beside them (``fold_table(at=0)``, far more often than the schedule asks). ``over_alone`` is
the best with-folds round's commits a second over the best alone round's (goal at least 0.8);
``longest_wait_s`` the longest a bucket waited for its fold after a pass first had to skip it
(a writer committed meanwhile), over every with-folds round, and ``starved`` how many waited
longer than 10 s (goal none). A full run writes ``benchmarks/results/fold_writers.json``;
``--quick`` and ``--smoke`` write into a fresh temporary folder (benchmarks/common.py says the
rule).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save

GOAL_OVER_ALONE = 0.8


def run(docs: int, commits: int, writers: int, pairs: int) -> dict[str, Any]:
    from benchmarks.doc_table_outbox import STARVED_AFTER_S, run_writers

    root = Path(tempfile.mkdtemp(prefix="fold-writers-"))
    rounds = []
    try:
        for p in range(pairs):
            rounds.append(run_writers(root / f"pair-{p}", docs, commits, writers))
            shutil.rmtree(root / f"pair-{p}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    alone = max(r["alone"]["commits_per_second"] for r in rounds)
    folded = max(r["with_folds"]["commits_per_second"] for r in rounds)
    folds = [r["with_folds"]["folds"] for r in rounds]
    ratio = folded / alone if alone else 0.0
    starved = sum(f["starved"] for f in folds)
    return {
        "documents": docs,
        "writers": writers,
        "commits_per_round": commits * writers,
        "pairs": rounds,
        "alone_commits_per_second": alone,
        "with_folds_commits_per_second": folded,
        "over_alone": round(ratio, 3),
        "bucket_folds": sum(f["bucket_folds"] for f in folds),
        "bucket_folds_skipped": sum(f["bucket_folds_skipped"] for f in folds),
        "longest_wait_s": max(f["longest_wait_s"] for f in folds),
        "starved": starved,
        "starved_after_s": STARVED_AFTER_S,
        "goal_over_alone": GOAL_OVER_ALONE,
        "meets_goal": ratio >= GOAL_OVER_ALONE and starved == 0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10,000 documents, 1 pair")
    add_output_options(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        data = run(1_000, 1, 1, 1)
    elif args.quick:
        data = run(10_000, 10, 4, 1)
    else:
        data = run(100_000, 25, 4, 2)
    path = save(args, "fold_writers", data)
    print(f"alone {data['alone_commits_per_second']} commits/s, with folds "
          f"{data['with_folds_commits_per_second']} ({data['over_alone']}x); "
          f"{data['bucket_folds']} folds, {data['bucket_folds_skipped']} skipped; longest wait "
          f"{data['longest_wait_s']} s, {data['starved']} starved -> {path}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Dispatch cost per message as units of work grow (issue 45, P2b): 100,000 documents per unit of
work against 1,000, immediate dispatch over the SQL transport on SQLite.

    python -m benchmarks.dispatch_scale            # 1,000 x 10 and 100,000 x 2, alternating
    python -m benchmarks.dispatch_scale --quick    # 1,000 x 5 and 20,000 x 1
    python -m benchmarks.dispatch_scale --smoke    # 10 x 2 and 100 x 1

Each case is ``benchmarks.dispatch.run_case`` (a fresh workspace, the default coalesced sends and
deferred watermarks; ``messages_per_second`` is messages / the dispatch time after each commit
plus the final flush of the marks). The two sizes alternate, best of their rounds each (a burst
of load hits both). ``cost_ratio`` is the small case's rate over the large one's: the cost per
message at the large size relative to the small (goal at most 1.2). A full run writes
``benchmarks/results/dispatch_scale.json``; ``--quick`` and ``--smoke`` write into a fresh
temporary folder (benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, save

GOAL = 1.2
DEFERRED_WINDOW = 0.2  # the default watermark_window (benchmarks.dispatch)


def run(small: int, small_rounds: int, large: int, repeats: int) -> dict[str, Any]:
    from benchmarks.dispatch import run_case

    root = Path(tempfile.mkdtemp(prefix="dispatch-scale-"))
    cases: dict[str, list[dict[str, Any]]] = {"small": [], "large": []}
    try:
        for r in range(repeats):
            order = ["small", "large"] if r % 2 == 0 else ["large", "small"]
            for side in order:
                docs, rounds = (small, small_rounds) if side == "small" else (large, 1)
                case = run_case(root, docs, rounds, coalesce=True, window=DEFERRED_WINDOW)
                cases[side].append(case)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    best = {k: max(v, key=lambda c: float(c["messages_per_second"])) for k, v in cases.items()}
    ratio = best["small"]["messages_per_second"] / best["large"]["messages_per_second"]
    return {
        "small": best["small"],
        "large": best["large"],
        "rounds_per_s": {k: [c["messages_per_second"] for c in v] for k, v in cases.items()},
        "cost_ratio": round(ratio, 3),
        "goal_cost_ratio": GOAL,
        "meets_goal": ratio <= GOAL,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1,000 x 5 and 20,000 x 1")
    add_output_options(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        data = run(10, 2, 100, 2)
    elif args.quick:
        data = run(1000, 5, 20_000, 2)
    else:
        data = run(1000, 10, 100_000, 2)
    path = save(args, "dispatch_scale", data)
    s, big = data["small"], data["large"]
    print(f"{s['docs_per_unit_of_work']:,} per unit: {s['messages_per_second']:,} msg/s; "
          f"{big['docs_per_unit_of_work']:,}: {big['messages_per_second']:,} msg/s; cost ratio "
          f"{data['cost_ratio']} -> {path}")  # fmt: skip


if __name__ == "__main__":
    main()

"""A benchmark at two revisions of the code, interleaved in one run: was a change slower?

    python -m benchmarks.revisions --before e529ccd --after HEAD          # results/revisions.json
    python -m benchmarks.revisions --before e529ccd --after HEAD --pairs 3 --quick
    python -m benchmarks.revisions --smoke                                # HEAD against itself

Why at two revisions rather than a switch in the code: a refactoring's "before" should not stay in
production code to be measured (issue 30 removed such a switch from the dispatcher). Each
revision's tree is extracted with ``git archive`` into a temporary folder (read-only to the
repository: no worktree, no checkout), and ``python -m benchmarks.<benchmark> --quick`` runs there
(the folder comes first on ``sys.path``, so its packages shadow the installed ones), before and
after alternating, ``--pairs`` times, so one machine load applies to both. The verdict is per
case on the ratio after/before of ``messages_per_second``: the median of the pairs' ratios and
its quartiles; "no slower" when the median ratio is at least ``1 - NOISE``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, machine, percentile, save

REPO = Path(__file__).resolve().parents[1]
#: A median ratio this far below 1 is within the run-to-run noise of a quiet 2-core machine.
NOISE = 0.03


def extract(revision: str, into: Path) -> Path:
    """The tree of ``revision`` under ``into`` (``git archive``: reads the repository only)."""
    into.mkdir(parents=True)
    archive = into.with_suffix(".tar")
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", revision], cwd=REPO, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def _commit(revision: str) -> str:
    """The full commit id ``revision`` names."""
    return subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def run_once(tree: Path, benchmark: str, mode: str, out: Path) -> dict[str, Any]:
    """One run of ``benchmarks.<benchmark> --<mode>`` in ``tree``; its results file, read."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-m", f"benchmarks.{benchmark}", f"--{mode}", "--out", str(out)],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (found,) = out.glob(f"{benchmark}.{mode}.json")
    data: dict[str, Any] = json.loads(found.read_text())
    found.unlink()
    return data


def rates(result: dict[str, Any]) -> dict[str, float]:
    """Each case's ``messages_per_second`` (the dispatch benchmark's shape)."""
    return {name: float(c["messages_per_second"]) for name, c in result["cases"].items()}


def compare(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, Any]:
    """Per case: both sides' medians, the pairs' ratios after/before, their median and
    quartiles, and the verdict."""
    out: dict[str, Any] = {}
    for case in sorted(before[0]):
        ratios = [a[case] / b[case] for b, a in zip(before, after, strict=True) if b[case] > 0]
        median = statistics.median(ratios)
        out[case] = {
            "before_messages_per_second": round(statistics.median(b[case] for b in before), 1),
            "after_messages_per_second": round(statistics.median(a[case] for a in after), 1),
            "ratio_median": round(median, 3),
            "ratio_quartiles": [round(percentile(ratios, 25), 3), round(percentile(ratios, 75), 3)],
            "verdict": "no slower" if median >= 1 - NOISE else "slower",
        }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="HEAD", help="the revision before the change")
    parser.add_argument("--after", default="HEAD", help="the revision after it")
    parser.add_argument("--benchmark", default="dispatch", help="benchmarks.<name> to run")
    parser.add_argument("--pairs", type=int, default=5, help="before/after pairs, interleaved")
    parser.add_argument("--quick", action="store_true", help="2 pairs")
    add_output_options(parser)
    args = parser.parse_args(argv)
    pairs = 1 if args.smoke else 2 if args.quick else args.pairs
    mode = "smoke" if args.smoke else "quick"  # the benchmark's own quick run, per side
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-revisions-"))
    try:
        commits = {
            side: _commit(rev) for side, rev in (("before", args.before), ("after", args.after))
        }
        # one tree per commit: the same commit on both sides (--smoke: HEAD against itself) is
        # one extraction, whose bytecode the second side's runs then reuse
        by_commit = {c: extract(c, root / c) for c in dict.fromkeys(commits.values())}
        trees = {side: by_commit[c] for side, c in commits.items()}
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for i in range(pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                result = run_once(trees[side], args.benchmark, mode, root / "out")
                results[side].append(rates(result))
                print(f"pair {i + 1}/{pairs} {side}: {results[side][-1]}")
        cases = compare(results["before"], results["after"])
        data = {
            "benchmark": f"benchmarks.{args.benchmark} --{mode}, at two revisions, interleaved",
            "machine": machine(),
            "before": commits["before"][:10],
            "after": commits["after"][:10],
            "pairs": pairs,
            "noise": NOISE,
            "cases": cases,
            "no_slower": all(c["verdict"] == "no slower" for c in cases.values()),
        }
        path = save(args, "revisions", data)
        for name, c in cases.items():
            print(
                f"{name:>40}: {c['before_messages_per_second']:>9.1f} -> "
                f"{c['after_messages_per_second']:>9.1f} msg/s, ratio {c['ratio_median']} "
                f"({c['ratio_quartiles'][0]}..{c['ratio_quartiles'][1]}) {c['verdict']}"
            )
        print(f"wrote {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

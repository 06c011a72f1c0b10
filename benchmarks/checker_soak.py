"""The checker soak: ``outbox check`` over many seeds, in concurrent chunks, merged into one file.

    python -m benchmarks.checker_soak --first-seed 1001 --seeds 1000 --chunks 8 --scale 0.5 \\
        --workdir /tmp/soak [--deadline 14:55]
    python -m benchmarks.checker_soak --quick [--seeds 16]   # a few seeds: is it sound, how fast
    python -m benchmarks.checker_soak --smoke   # one seed, one chunk, the smallest scale

Each chunk is one ``outbox check --results FILE --workdir DIR`` process over consecutive seeds
(a seed is mostly waiting, so chunks overlap well even on two cores). ``--results`` is rewritten
after every seed, so when ``--deadline`` (UTC, HH:MM) comes first the chunks are stopped and what
they finished is merged, with ``partial: true`` and the seeds that did not run. A failed seed keeps
its folder under ``--workdir`` (default: a fresh temporary folder). The merge, with the code's
commit and the wall time, goes to ``benchmarks/results/checker_soak.json``; ``--quick`` (8 seeds
unless ``--seeds`` says otherwise) and ``--smoke`` write ``checker_soak.quick.json`` and
``checker_soak.smoke.json`` into a fresh temporary folder, never into benchmarks/results/, so a
trial run never replaces the committed soak; ``--out DIR`` chooses the folder
(benchmarks/common.py says the rule).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import add_output_options, results_dir, results_name

ROOT = Path(__file__).resolve().parent.parent
SOAK_SEEDS = 1000
QUICK_SEEDS = 8


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
        )
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "status",
                "--porcelain",
                "--",
                "outbox",
                "dispatcher",
                "rescuer",
                "migrations",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return head.stdout.strip() + (" (+uncommitted changes)" if dirty.stdout.strip() else "")


def _chunks(first: int, seeds: int, chunks: int) -> list[tuple[int, int]]:
    size, extra = divmod(seeds, chunks)
    out, start = [], first
    for i in range(chunks):
        n = size + (1 if i < extra else 0)
        if n:
            out.append((start, n))
            start += n
    return out


def merge_totals(totals: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the chunks' ``aggregate`` totals: counts add, lists concatenate, dicts merge (counts
    add), the maximum latency is the largest."""
    out: dict[str, Any] = {}
    for t in totals:
        for k, v in t.items():
            if k == "rescued_latency_max_s":
                out[k] = max(float(out.get(k, 0.0)), float(v))
            elif isinstance(v, bool):
                out[k] = out.get(k, False) or v
            elif isinstance(v, int | float):
                out[k] = out.get(k, 0) + v
            elif isinstance(v, list):
                out[k] = [*out.get(k, []), *v]
            elif isinstance(v, dict):
                merged = dict(out.get(k, {}))
                for kk, vv in v.items():
                    merged[kk] = merged.get(kk, 0) + vv if isinstance(vv, int) else vv
                out[k] = dict(sorted(merged.items()))
    return out


def merge(
    docs: list[dict[str, Any]],
    *,
    planned: list[int],
    wall_s: float,
    commit: str,
    scale: float,
    chunks: int,
) -> dict[str, Any]:
    rows = sorted((r for d in docs for r in d.get("seeds", [])), key=lambda r: int(r["seed"]))
    total = merge_totals([d["total"] for d in docs if "total" in d])
    ran = {int(r["seed"]) for r in rows}
    missing = [s for s in planned if s not in ran]
    return {
        "kind": "checker-soak",
        "command": f"outbox check --first-seed {min(planned)} --seeds {len(planned)} "
        f"--scale {scale}",
        "commit": commit,
        "chunks": chunks,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "partial": bool(missing),
        "seeds_planned": len(planned),
        "seeds_run": len(rows),
        "seeds_not_run": missing,
        "ok_seeds": sum(1 for r in rows if r["ok"]),
        "failed_seeds": [int(r["seed"]) for r in rows if not r["ok"]],
        **_durations([float(r["duration_s"]) for r in rows]),
        "total": total,
        "failed": [f for d in docs for f in d.get("failed", [])],
        "seeds": rows,
    }


def _durations(values: list[float]) -> dict[str, float]:
    """Per-seed wall times (keys end in ``_s``: the docs test reads them as seconds)."""
    s = sorted(values) or [0.0]
    return {
        "seed_duration_p50_s": s[len(s) // 2],
        "seed_duration_max_s": s[-1],
        "seed_duration_sum_s": round(sum(s), 1),
    }


def _deadline(text: str | None) -> float | None:
    if not text:
        return None
    now = datetime.now(UTC)
    hh, mm = (int(x) for x in text.split(":"))
    at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    return time.monotonic() + (at - now).total_seconds()


def _finished_run(meta: Path, files: list[Path]) -> tuple[str, float]:
    """The commit and wall time of the chunks already run (``--merge-only``)."""
    m = json.loads(meta.read_text())
    last = max((f.stat().st_mtime for f in files if f.exists()), default=time.time())
    return m["commit"], last - float(m["started"])


def _run_chunks(
    args: argparse.Namespace, chunks: list[tuple[int, int]], files: list[Path], meta: Path
) -> tuple[str, float]:
    """One ``outbox check`` process per chunk, waited for until the deadline; the commit and the
    wall time."""
    commit, started = _commit(), time.time()
    meta.write_text(json.dumps({"commit": commit, "started": started}))
    procs = [_start_chunk(args, first, n, f) for (first, n), f in zip(chunks, files, strict=True)]
    _wait_for(procs, _deadline(args.deadline))
    return commit, time.time() - started


def _start_chunk(
    args: argparse.Namespace, first: int, n: int, results: Path
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "outbox.app.cli",  # ``outbox`` of this interpreter
        "check",
        "--first-seed", str(first),
        "--seeds", str(n),
        "--scale", str(args.scale),
        "--workdir", str(args.workdir / f"chunk-{first}"),
        "--results", str(results),
        "--json",
    ]  # fmt: skip
    log = open(args.workdir / f"chunk-{first}.log", "w")  # noqa: SIM115 - child's stderr
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def _wait_for(procs: list[subprocess.Popen[bytes]], deadline: float | None) -> None:
    """Until every process ended, or the deadline: then SIGTERM the rest and wait for them."""
    while running := [p for p in procs if p.poll() is None]:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            for p in running:
                os.killpg(p.pid, signal.SIGTERM)
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=5 if left is None else min(5.0, left))
    for p in procs:
        p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--first-seed", type=int, default=1001)
    ap.add_argument("--seeds", type=int, help="default: 1000 (--quick: 8)")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--workdir", type=Path, help="default: a fresh temporary folder")
    ap.add_argument("--deadline", help="UTC HH:MM: stop the chunks then and merge what finished")
    ap.add_argument("--merge-only", action="store_true", help="merge the chunk files already there")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a few seeds (8 unless --seeds), to see that the soak runs and how fast; written "
        "like --smoke, never into benchmarks/results/",
    )
    add_output_options(ap)
    args = ap.parse_args(argv)
    if args.seeds is None:
        args.seeds = QUICK_SEEDS if args.quick else SOAK_SEEDS
    if args.smoke:
        args.seeds, args.chunks, args.scale = 1, 1, 0.5
    if args.workdir is None:
        if args.merge_only:
            ap.error("--merge-only needs the --workdir the chunks wrote to")
        args.workdir = Path(tempfile.mkdtemp(prefix="outbox-soak-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    planned = list(range(args.first_seed, args.first_seed + args.seeds))
    chunks = _chunks(args.first_seed, args.seeds, args.chunks)
    files = [args.workdir / f"chunk-{first}.json" for first, _ in chunks]
    meta = args.workdir / "soak-meta.json"
    if args.merge_only:
        commit, wall = _finished_run(meta, files)
    else:
        commit, wall = _run_chunks(args, chunks, files, meta)
    docs = [json.loads(f.read_text()) for f in files if f.exists()]
    result = merge(
        docs, planned=planned, wall_s=wall, commit=commit, scale=args.scale, chunks=len(chunks)
    )
    if args.smoke or args.quick:
        result["smoke" if args.smoke else "quick"] = True
    name = results_name("checker_soak", quick=args.quick, smoke=args.smoke)
    out = results_dir(args.out, quick=args.smoke or args.quick) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(
        f"{result['seeds_run']}/{len(planned)} seeds, {result['ok_seeds']} ok, failed "
        f"{result['failed_seeds']}, partial={result['partial']}, wall {result['wall_s']} s; "
        f"wrote {out}",
        file=sys.stderr,
    )
    return 0 if not result["failed_seeds"] else 5


if __name__ == "__main__":
    raise SystemExit(main())

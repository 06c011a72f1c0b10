"""Shared bits of the benchmark harness: timing, percentiles, and where the results file goes.

Where a run writes (one rule for every ``benchmarks/*.py``):

* a full run writes ``benchmarks/results/<name>.json``, the committed file the docs quote;
* ``--quick`` and ``--smoke`` runs never write into ``benchmarks/results/``: their file
  (``<name>.quick.json``, ``<name>.smoke.json``) goes to a fresh temporary folder, printed at the
  end. (The ``*.quick.json`` files already in ``benchmarks/results/`` are earlier quick runs the
  docs cite; no run rewrites them.)
* ``--out DIR`` puts the file in DIR instead, for any run; with ``--quick`` or ``--smoke`` a DIR
  inside ``benchmarks/results/`` is refused.

``--smoke`` is every benchmark's smallest size, smaller than ``--quick``: each step of the full
run once, on a few documents or messages, so tests/benchmarks/test_smoke.py can prove that every
benchmark still runs. Its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in samples_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
    }


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def rescue_pass_since(store: Any, base: int, *, engine: Any, now: datetime, delay: float) -> Any:
    """A rescuer ("bench", its checkpoint in memory at version ``base``, an in-memory sink)
    whose clock stands at ``now``: its pass reads every commit after ``base`` older than
    ``delay`` then. The benchmarks that time a rescuer pass share it."""
    from outbox.core.clock import ManualClock
    from rescuer.checkpoint import InMemoryCheckpointStore
    from rescuer.runner import RescuePass
    from rescuer.sink import InMemorySink

    checkpoints = InMemoryCheckpointStore()
    checkpoints.write(
        store.uri,
        "bench",
        expected_generation=None,
        version=base,
        at=datetime.now(UTC),
        details={"table_id": store.table_id},
    )
    return RescuePass(
        store,
        engine,
        checkpoints,
        InMemorySink(),
        clock=ManualClock(now),
        delay=delay,
        name="bench",
    )


def machine() -> dict[str, Any]:
    import deltalake
    import pyarrow

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "deltalake": deltalake.__version__,
        "pyarrow": pyarrow.__version__,
    }


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` and ``--smoke``, the same on every benchmark (the module docstring)."""
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the results file into DIR (default: benchmarks/results/ for a full run, a "
        "fresh temporary folder for --quick and --smoke)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest size, every step once (tests/benchmarks/test_smoke.py); written like "
        "--quick, never into benchmarks/results/",
    )


def results_name(name: str, *, quick: bool = False, smoke: bool = False) -> str:
    """``name``, ``name.quick`` or ``name.smoke``: the results file's stem for this kind of run."""
    return f"{name}.smoke" if smoke else f"{name}.quick" if quick else name


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def results_dir(out: Path | None, *, quick: bool) -> Path:
    """Where a run's results file goes: ``out`` when given, else ``benchmarks/results/`` for a
    full run and a fresh temporary folder for a quick (or smoke) one, which never writes into
    ``benchmarks/results/``."""
    if out is not None:
        if quick and _inside(out, RESULTS):
            raise SystemExit(
                f"--out {out}: a --quick or --smoke run never writes into {RESULTS} "
                "(a full run writes the committed files)"
            )
        return out
    if quick:
        return Path(tempfile.mkdtemp(prefix="outbox-bench-results-"))
    return RESULTS


def save(args: argparse.Namespace, name: str, data: dict[str, Any]) -> Path:
    """Write a run's results by the rule in the module docstring: ``args`` come from a parser
    given ``add_output_options`` (and ``--quick``, when the benchmark has one)."""
    quick, smoke = bool(getattr(args, "quick", False)), bool(args.smoke)
    stem = results_name(name, quick=quick, smoke=smoke)
    if smoke:
        data = {"smoke": True, **data}
    return write_results(stem, data, to=results_dir(args.out, quick=quick or smoke))


def write_results(name: str, data: dict[str, Any], *, to: Path) -> Path:
    """Write ``to/<name>.json`` (``to`` from ``results_dir``) with the run's time and machine."""
    to.mkdir(parents=True, exist_ok=True)
    path = to / f"{name}.json"
    data = {
        "benchmark": name,
        "measured_at": datetime.now(UTC).isoformat(),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def add_object_store_options(parser: argparse.ArgumentParser, *, s3: bool = True) -> None:
    """``--azurite URL`` (and ``--s3 URL``): a server already running, instead of one started
    for the run (tests/benchmarks passes the suite's, as ``--pg-url`` passes its PostgreSQL)."""
    parser.add_argument(
        "--azurite", metavar="URL", help="use the Azurite at URL instead of starting one"
    )
    if s3:
        parser.add_argument(
            "--s3", metavar="URL", help="use moto's S3 server at URL instead of starting one"
        )


@contextmanager
def object_store_servers(
    azurite_url: str | None, s3_url: str | None = None, *, s3: bool = True
) -> Iterator[tuple[Any, Any]]:
    """Azurite (and moto's S3 server when ``s3``): the ones at the URLs given, else started
    here and stopped at the end. Their methods (``create_container``, ``create_bucket``,
    ``storage_options``) are tests/objectstore/servers.py's either way; deltalake finds Azurite
    through ``AZURITE_BLOB_STORAGE_URL`` in this process's environment, set here."""
    from tests.objectstore.servers import Azurite, MotoS3, azurite_bin, moto_bin

    def running(cls: Any, url: str) -> Any:
        server = cls.__new__(cls)  # no port, folder or process of its own: only the URL
        server.url, server._made = url.rstrip("/"), set()
        return server

    def started(cls: Any, binary: Any, stack: ExitStack) -> Any:
        if binary is None:
            raise SystemExit(
                "the object-store servers are not installed: run scripts/ensure-azurite.sh and "
                "scripts/setup.sh --dev"
            )
        server = cls(binary)
        server.start()
        stack.callback(server.stop)
        return server

    with ExitStack() as stack:
        azurite = (
            running(Azurite, azurite_url) if azurite_url else started(Azurite, azurite_bin(), stack)
        )
        s3_server = None
        if s3:
            s3_server = running(MotoS3, s3_url) if s3_url else started(MotoS3, moto_bin(), stack)
        os.environ.update(azurite.environment())
        yield azurite, s3_server

"""The document table on object storage (issue 32): Azure (Azurite) and S3 (moto's server) against
the local disk, each figure beside its floor from the same run.

    python -m benchmarks.object_store            # results/object_store.json
    python -m benchmarks.object_store --quick    # fewer rounds and commits
    python -m benchmarks.object_store --smoke    # every step once, a few commits

Per store (``local``, ``azure``, ``s3``), on a fresh table:

* ``ratio``: a unit of work that creates one document with one message against the same save in
  raw deltalake calls (``benchmarks.write_path``'s floor: build the row, refresh, read the id,
  append with its application transaction), interleaved sample by sample (goal: at most 1.2x);
* ``dispatch``: units of work of 100 documents with one message each, immediate dispatch to the
  SQL queue (SQLite): messages from commit to settled in the queue per second;
* ``rescuer_feed_pass``: one rescuer pass over 20 commits of 100 documents (local engine);
* ``upkeep``: ``commits`` single-document units of work with the writers' upkeep and an
  ``outbox maintain`` every 200 commits (the schedule docs/object-storage.md gives for a table on
  an object store), the commit p50 per 200-commit window and max/min of those (goal: within 20%).

The servers are local processes on this machine, so only the ratios between stores mean
anything: a cloud store adds its network round trips to every figure.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_object_store_options,
    add_output_options,
    object_store_servers,
    rescue_pass_since,
    save,
    summarize_ms,
)

STORES = ("local", "azure", "s3")
SIZES = {
    "full": {
        "rounds": 60,
        "dispatch_units": 10,
        "commits": 2000,
        "window": 200,
        "feed_commits": 20,
    },
    "quick": {"rounds": 20, "dispatch_units": 4, "commits": 400, "window": 100, "feed_commits": 20},
    # every step once: one ratio round (both orders are the same two calls), one upkeep window
    # (it ends in a maintenance), a one-commit feed
    "smoke": {"rounds": 1, "dispatch_units": 1, "commits": 3, "window": 3, "feed_commits": 1},
}


class Place:
    """Where one store's tables go: a folder, or a fresh container or bucket per table."""

    def __init__(self, kind: str, root: Path, server: Any) -> None:
        self.kind, self.root, self.server = kind, root, server

    def settings(self, name: str, **overrides: Any) -> Any:
        from outbox.core.settings import Settings

        ws = self.root / name
        ws.mkdir(parents=True, exist_ok=True)
        if self.kind == "local":
            return Settings(workspace=ws, **overrides)
        bucket = f"b{uuid.uuid4().hex[:16]}"
        if self.kind == "azure":
            self.server.create_container(bucket)
            uri = f"az://{bucket}/documents"
        else:
            self.server.create_bucket(bucket)
            uri = f"s3://{bucket}/documents"
        return Settings(
            workspace=ws,
            table_uri=uri,
            storage_options=self.server.storage_options(),
            **overrides,
        )


def _open(settings: Any, **kw: Any) -> Any:
    from outbox.app.facade import Outbox

    return Outbox.open(settings=settings, **kw)


def bench_ratio(place: Place, rounds: int) -> dict[str, Any]:
    from benchmarks.write_path import _raw_save, _time, _uow_create

    ob = _open(place.settings("ratio", compact_every=0), transport="memory")
    raw: list[float] = []
    uow: list[float] = []
    for i in range(rounds):
        steps = [
            (raw, partial(_raw_save, ob, f"raw-{i}", 1)),
            (uow, partial(_uow_create, ob, f"u-{i}")),
        ]
        if i % 2:
            steps.reverse()
        for samples, fn in steps:
            samples.append(_time(fn))
    ob.close()
    return {
        "raw": summarize_ms(raw),
        "unit_of_work": summarize_ms(uow),
        "save_vs_raw_ratio": round(statistics.median(uow) / statistics.median(raw), 3),
    }


def bench_dispatch(place: Place, units: int) -> dict[str, Any]:
    """``units`` units of work of 100 documents, immediate dispatch to the SQL queue, the
    watermark inline (``watermark_window`` 0: each unit's time includes its whole dispatch)."""
    ob = _open(
        place.settings("dispatch", compact_every=0, watermark_window=0.0),
        default_destination="shipments",
    )
    start = time.perf_counter()
    for u in range(units):
        with ob.unit_of_work() as uow:
            for i in range(100):
                uow.create(f"u{u}-{i}", type="Shipment").send("Created", {"i": i})
    elapsed = time.perf_counter() - start
    pending = ob.store.scan_pending().num_rows
    ob.close()
    return {
        "messages": units * 100,
        "seconds": round(elapsed, 3),
        "messages_per_second": round(units * 100 / elapsed, 1),
        "left_pending": pending,
    }


def bench_feed_pass(place: Place, commits: int) -> dict[str, Any]:
    from rescuer.cdf_local import LocalEngine

    settings = place.settings("feed", compact_every=0, dispatch="deferred")
    ob = _open(settings, transport="memory")
    base = ob.store.version()
    for c in range(commits):
        with ob.unit_of_work() as uow:
            for i in range(100):
                uow.create(f"c{c}-{i}", type="Shipment").send("Created", {"i": i}, destination="q")
    rescue = rescue_pass_since(
        ob.store,
        base,
        engine=LocalEngine(storage_options=settings.storage_options),
        now=datetime.now(UTC) + timedelta(hours=1),
        delay=15,
    )
    t0 = time.perf_counter()
    report = rescue.run()
    seconds = time.perf_counter() - t0
    ob.close()
    return {
        "seconds": round(seconds, 3),
        "mode": report.mode,
        "change_rows": report.change_rows,
        "enqueued": report.commands_enqueued,
    }


def bench_upkeep(place: Place, commits: int, window: int) -> dict[str, Any]:
    from outbox.app.maintenance import maintain
    from outbox.core.clock import SystemClock

    settings = place.settings("upkeep", compact_every=100, rescue_delay=15.0, log_retention=15.0)
    ob = _open(settings, transport="memory", default_destination="q")
    windows: list[dict[str, Any]] = []
    samples: list[float] = []
    for n in range(commits):
        t0 = time.perf_counter()
        with ob.unit_of_work() as uow:
            doc = uow.get(f"d{n % 50}") or uow.create(f"d{n % 50}", type="T")
            doc.send("E", {"n": n})
        samples.append(time.perf_counter() - t0)
        if (n + 1) % window == 0:
            windows.append({"commits": n + 1, **summarize_ms(samples)})
            samples = []
            maintain(
                ob.store,
                clock=SystemClock(),
                sql_url=settings.sql_url,
                rescue_delay_seconds=settings.rescue_delay,
                storage_options=settings.storage_options,
                settings=settings,
                log_retention_seconds=settings.log_retention,
            )
    ob.close()
    p50s = [w["p50_ms"] for w in windows]
    return {
        "commits": commits,
        "window": window,
        "windows": windows,
        "max_over_min_window_p50": round(max(p50s) / min(p50s), 3) if p50s else None,
    }


def run_store(kind: str, root: Path, server: Any, size: dict[str, int]) -> dict[str, Any]:
    place = Place(kind, root / kind, server)
    out = {
        "ratio": bench_ratio(place, size["rounds"]),
        "dispatch": bench_dispatch(place, size["dispatch_units"]),
        "rescuer_feed_pass": bench_feed_pass(place, size["feed_commits"]),
        "upkeep": bench_upkeep(place, size["commits"], size["window"]),
    }
    print(
        kind, out["ratio"]["save_vs_raw_ratio"], out["dispatch"]["messages_per_second"], flush=True
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and commits")
    add_object_store_options(parser)
    add_output_options(parser)
    args = parser.parse_args(argv)
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-objectstore-"))
    try:
        with object_store_servers(args.azurite, args.s3) as (azurite, s3):
            servers = {"local": None, "azure": azurite, "s3": s3}
            data: dict[str, Any] = {"stores": {}, "sizes": SIZES[kind]}
            for store in STORES:
                data["stores"][store] = run_store(store, root, servers[store], SIZES[kind])
        local = data["stores"]["local"]["dispatch"]["messages_per_second"]
        data["dispatch_vs_local"] = {
            s: round(data["stores"][s]["dispatch"]["messages_per_second"] / local, 3)
            for s in STORES
        }
        print(f"wrote {save(args, 'object_store', data)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

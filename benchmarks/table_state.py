"""The table's state under a writer of new documents (issue 47): checkpoints, open time, commit
latency and disk, over a long run and a simulated day.

    python -m benchmarks.table_state            # results/table_state.json (about 60 minutes)
    python -m benchmarks.table_state --quick    # 200,000 documents, 4-minute runs, a tenth of a day
    python -m benchmarks.table_state --smoke    # every part once, on a few documents

In one run:

* ``candidates``: the ways a save can carry its two-saves check, side by side
  (``benchmarks.table_state_sim``): commit p50, checkpoint bytes and open time after the same
  commits, the false-conflict rate of two writers of disjoint new documents, and whether two
  racing saves of one document (an update, or two creations of one id) still conflict.
* ``day``: a day of a busy writer's application transactions and tombstones through deltalake's
  checkpoint writer, in rounds (``benchmarks.table_state_sim``): the checkpoint's bytes, rows and
  open time against the app ids written, with the table properties ``outbox migrate`` sets and
  with the layout before.
* ``local``: the writer (``benchmarks.table_state_run``) from a table of ``docs`` documents for
  ``minutes`` on the local disk, beside a consumer and ``outbox rescue --every 30s``: commit p50
  per minute and of the first and last ``WINDOW_MIN`` minutes, and every ``sample_s`` the
  checkpoint, the open time and the disk by kind.
* ``azure``: the same on Azurite for a shorter run, from a smaller table (``outbox maintain``
  every 200 versions, as docs/object-storage.md schedules it; no rescuer process).

Every run uses the product's defaults but ``log_retention``: ``--log-retention`` (default 60 s,
docs/delta.md's advice for a busy table: each file in the log costs every commit, and the log
holds about ``log_retention`` times commits per second files). ``--log-retention 15m`` measures the
default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks import table_state_run as R
from benchmarks import table_state_sim as S
from benchmarks.common import (
    add_object_store_options,
    add_output_options,
    object_store_servers,
    save,
)

WINDOW_MIN = 5.0
LOAD_CHUNK = 100_000
#: Per kind of run: the table, the writer's minutes and sampling, the candidates' commits and
#: pairs, the day's rounds x commits x app ids per commit, Azurite's table and minutes, and the
#: writer's units of work instead of its minutes (None: run the minutes).
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "docs": 1_000_000,
        "minutes": 30.0,
        "sample_s": 30.0,
        "window_min": WINDOW_MIN,
        "candidates": (500, 20),
        "day": (55, 100, 10_000),
        "azure_docs": 100_000,
        "azure_minutes": 10.0,
        "units": None,
    },
    "quick": {
        "docs": 200_000,
        "minutes": 4.0,
        "sample_s": 15.0,
        "window_min": 1.0,
        "candidates": (100, 10),
        "day": (10, 100, 5_500),
        "azure_docs": 20_000,
        "azure_minutes": 2.0,
        "units": None,
    },
    # every part once: one commit and one pair a candidate, one unit of work a writer run (not
    # a quarter of a minute of them: a unit takes seconds on a loaded machine)
    "smoke": {
        "docs": 200,
        "minutes": 0.25,
        "sample_s": 5.0,
        "window_min": 0.1,
        "candidates": (1, 1),
        "day": (2, 5, 200),
        "azure_docs": 100,
        "azure_minutes": 0.2,
        "units": 1,
    },
}


def _settings_file(ws: Path, values: dict[str, Any]) -> Any:
    """Write ``ws/outbox.toml`` (the rescuer process reads it too) and load the settings."""
    from outbox.core.settings import Settings

    ws.mkdir(parents=True, exist_ok=True)
    lines = [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    (ws / "outbox.toml").write_text("\n".join(lines) + "\n")
    return Settings.load(ws)


def seed(settings: Any, docs: int) -> None:
    """The table as ``outbox maintain`` leaves ``docs`` documents: migrated, loaded (each
    document's message already sent), folded, compacted and checkpointed."""
    from deltalake import write_deltalake

    from benchmarks.doc_table import _rows
    from migrations.runner import migrate
    from outbox.app.maintenance import maintain
    from outbox.core.clock import SystemClock
    from outbox.delta.store import DeltaDocumentStore

    migrate(settings)
    opts = dict(settings.storage_options) or None
    for start in range(0, docs, LOAD_CHUNK):
        ids = [f"seed-{i:09d}" for i in range(start, min(docs, start + LOAD_CHUNK))]
        rows = _rows(ids, 1)
        sent = pa.array([1] * rows.num_rows, pa.int64())
        rows = rows.set_column(
            rows.schema.get_field_index("dispatched_seq"), "dispatched_seq", sent
        )
        write_deltalake(settings.table_uri, rows, mode="append", storage_options=opts)
    store = DeltaDocumentStore(settings.table_uri, storage_options=settings.storage_options)
    maintain(
        store,
        clock=SystemClock(),
        sql_url=settings.sql_url,
        rescue_delay_seconds=settings.rescue_delay,
        storage_options=settings.storage_options,
        settings=settings,
    )
    store.close()


def run_local(root: Path, size: dict[str, Any], log_retention: float) -> dict[str, Any]:
    ws = root / "local"
    settings = _settings_file(
        ws, {"default_destination": R.DESTINATION, "log_retention": log_retention}
    )
    t0 = time.monotonic()
    seed(settings, size["docs"])
    built = time.monotonic() - t0
    print(f"local: {size['docs']} documents in {built:.0f} s", flush=True)
    out = R.run_writer(
        settings,
        minutes=size["minutes"],
        sample_s=size["sample_s"],
        window_min=size["window_min"],
        rescuer=True,
        maintain_every=None,
        workspace=ws,
        units=size["units"],
    )
    return {"store": "local", "seed_documents": size["docs"], "seed_s": round(built, 1), **out}


def run_azure(
    root: Path, size: dict[str, Any], log_retention: float, url: str | None = None
) -> dict[str, Any] | None:
    """The Azurite run, on the server at ``url`` (``--azurite``) or one started for it."""
    from tests.objectstore.servers import azurite_bin

    if url is None and azurite_bin() is None:
        print("azure: skipped, Azurite is not installed (scripts/ensure-azurite.sh)", flush=True)
        return None
    with object_store_servers(url, s3=False) as (server, _):
        container = f"b{uuid.uuid4().hex[:16]}"
        server.create_container(container)
        ws = root / "azure"
        settings = _settings_file(
            ws,
            {
                "default_destination": R.DESTINATION,
                "log_retention": log_retention,
                "table_uri": f"az://{container}/documents",
            },
        )
        settings = settings.replace(storage_options=server.storage_options())
        t0 = time.monotonic()
        seed(settings, size["azure_docs"])
        built = time.monotonic() - t0
        out = R.run_writer(
            settings,
            minutes=size["azure_minutes"],
            sample_s=size["sample_s"],
            window_min=min(size["window_min"], size["azure_minutes"] / 4),
            rescuer=False,
            maintain_every=R.MAINTAIN_EVERY,
            workspace=ws,
            units=size["units"],
        )
        return {
            "store": "azure (Azurite)",
            "seed_documents": size["azure_docs"],
            "seed_s": round(built, 1),
            **out,
        }


def main(argv: list[str] | None = None) -> None:
    from outbox.core.durations import parse_duration

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller table, shorter runs")
    parser.add_argument(
        "--log-retention",
        default="60s",
        metavar="DURATION",
        help="the runs' log_retention (default 60s; the product's default is 15m)",
    )
    parser.add_argument(
        "--minutes", type=float, help="the local writer's minutes (default: by kind of run)"
    )
    parser.add_argument(
        "--azure-minutes", type=float, help="the Azurite writer's minutes (default: by kind)"
    )
    parser.add_argument(
        "--parts",
        default="candidates,day,local,azure",
        help="which parts to run, comma-separated (default: all)",
    )
    add_object_store_options(parser, s3=False)
    add_output_options(parser)
    args = parser.parse_args(argv)
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    size = dict(SIZES[kind])
    if args.minutes:
        size["minutes"] = args.minutes
    if args.azure_minutes:
        size["azure_minutes"] = args.azure_minutes
    retention = parse_duration(args.log_retention)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    root = Path(tempfile.mkdtemp(prefix="outbox-bench-table-state-"))
    started = time.monotonic()
    data: dict[str, Any] = {
        "kind": kind,
        "log_retention_s": retention,
        "documents_per_unit": R.DOCS_PER_UNIT,
        "load_average_before": list(os.getloadavg()),
    }
    try:
        if "candidates" in parts:
            data["candidates"] = S.run_candidates(root / "candidates", *size["candidates"])
        if "day" in parts:
            data["day"] = S.run_day(root / "day", *size["day"])
        if "local" in parts:
            data["local"] = run_local(root, size, retention)
        if "azure" in parts:
            data["azure"] = run_azure(root, size, retention, args.azurite)
        data["load_average_after"] = list(os.getloadavg())
        data["wall_s"] = round(time.monotonic() - started, 1)
        print(f"wrote {save(args, 'table_state', data)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

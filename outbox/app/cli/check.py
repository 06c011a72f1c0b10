"""``outbox check``: the randomized end-to-end fault-injection soak (docs/checker.md)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import (
    emit_json,
    print_kv,
    print_table,
    quiet_chatty_loggers,
    snake_keys,
    stepper,
)
from outbox.app.cli.support import CliContext, json_option, pass_cli

_COLUMNS = [
    "seed",
    "ok",
    "committed",
    "delivered",
    "dup",
    "lost",
    "order",
    "phantom",
    "I4",
    "kills",
    "crashes",
    "rescue retried/errors",
    "rescued p95/max",
    "time",
]


@click.command()
@click.option(
    "--seeds",
    type=click.IntRange(1, 100_000),
    default=3,
    show_default=True,
    help="Seeds to run (each a different fault plan).",
)
@click.option("--first-seed", type=int, default=1, show_default=True, help="Start from this seed.")
@click.option(
    "--minutes",
    type=click.FloatRange(0, 24 * 60),
    default=0,
    show_default=True,
    help="Soak: after --seeds, keep running further seeds until this many minutes have passed.",
)
@click.option(
    "--scale",
    type=click.FloatRange(0.5, 50),
    default=1.0,
    show_default=True,
    help="Work per seed (writer rounds, fault horizon).",
)
@click.option(
    "--workdir",
    metavar="DIR",
    help="Where each seed's workspace, broker log and process logs go (default: a temporary "
    "folder). A failing seed's folder is kept for inspection.",
)
@click.option(
    "--sql",
    "sql",
    default="sqlite",
    show_default=True,
    metavar="sqlite|URL",
    help="The command queue's and rescuer checkpoints' database: each seed's own SQLite file, "
    "or a PostgreSQL URL (postgresql+psycopg://user@host:port/db) on which each seed gets a "
    "database of its own, dropped when the seed passed.",
)
@click.option(
    "--engine",
    metavar="NAME",
    default="local",
    show_default=True,
    help="The rescuer's engine: local or spark. spark starts one local SparkSession (Delta JARs "
    "from OUTBOX_DELTA_JARS or .cache/jars) and reuses it for every pass and seed.",
)
@click.option(
    "--writer",
    type=click.Choice(["python", "spark"]),
    default="python",
    show_default=True,
    help="spark: one writer per seed is a Spark driver applying batches through SparkOutbox "
    "(its own JVM; Delta JARs as for --engine spark) beside the Python writers, on some of "
    "the same documents; its planned crash is a kill or raise right after a batch's commit.",
)
@click.option(
    "--table-root",
    metavar="URI",
    default="",
    help="Put each seed's table on an object store under URI (az://container, abfss://..., "
    "s3://bucket; a folder per seed), reached with the settings' storage_options.",
)
@click.option(
    "--results",
    "results_file",
    metavar="FILE",
    help="Write the totals and one row per seed to FILE as JSON, rewritten after every seed "
    "(a long soak leaves what it finished even when stopped).",
)
@json_option
@pass_cli
def check(
    cli: CliContext,
    *,
    seeds: int,
    first_seed: int,
    minutes: float,
    scale: float,
    workdir: str | None,
    sql: str,
    engine: str,
    writer: str,
    table_root: str,
    results_file: str | None,
    as_json: bool,
) -> None:
    """Randomized end-to-end fault injection: writer processes, run-dispatcher worker processes
    and rescuer passes under seeded crashes (every crash point, raise or SIGKILL), SIGKILLs from
    outside, broker outages, send failures and Delta commit conflicts; then I1, I2, I3, I4 and I6
    are verified with exact counts. A seed replays its fault plan. Exit 0 when every seed held,
    5 when an invariant broke."""
    from outbox.app.checker.report import aggregate, results_document, write_results
    from outbox.app.checker.run import run_check

    quiet_chatty_loggers(cli.verbose)
    say = stepper(as_json, "outbox.check")
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="outbox-check-"))
    deadline = time.monotonic() + minutes * 60
    reports: list[Any] = []
    seed = first_seed
    while len(reports) < seeds or time.monotonic() < deadline:
        say(f"seed {seed} ...")
        r = run_check(
            seed,
            root,
            scale=scale,
            progress=say,  # its lines, the summary last, once: stdout, or stderr with --json
            sql=sql,
            engine=engine,
            writer=writer,
            table_root=table_root,
            storage_options=cli.settings().storage_options if table_root else {},
        )
        if not r.ok:
            say(f"seed {seed} FAILED: its files are in {root / f'seed-{seed}'}")
        reports.append(r)
        seed += 1
        if results_file:
            options = {
                "first_seed": first_seed,
                "scale": scale,
                "minutes": minutes,
                "sql": "sqlite" if sql == "sqlite" else "postgresql",
                "engine": engine,
                "writer": writer,
                "table": "object store" if table_root else "local disk",
            }
            write_results(Path(results_file), results_document(reports, options))
    total = aggregate(reports)
    if as_json:
        per_seed = [snake_keys(r.to_dict(), "invariants") for r in reports]
        emit_json({"total": total, "seeds": per_seed})
    else:
        print_table("outbox check: per seed", _COLUMNS, [_row(r) for r in reports])
        print_kv("outbox check: totals", [(k, v) for k, v in total.items()])
    if total["failed_seeds"]:
        raise SystemExit(exit_codes.INVARIANT_BROKEN)


def _row(r: Any) -> tuple[Any, ...]:
    return (
        r.seed,
        "ok" if r.ok else "FAILED",
        r.committed,
        r.deliveries,
        r.duplicates,
        len(r.lost),
        len(r.out_of_order),
        len(r.phantoms),
        len(r.saves_failed) + len(r.watermark_regressions),
        r.sigkills_sent,
        sum(r.crashes.values()),
        f"{r.rescue_passes_failed + r.rescue_passes_interrupted}/{len(r.rescue_errors)}",
        f"{r.latency_rescued['p95']:.2f}/{r.latency_rescued['max']:.2f}s",
        f"{r.duration_s:.0f}s",
    )


def register(group: click.Group) -> None:
    group.add_command(check)

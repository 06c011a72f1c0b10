"""The commands that show the guarantees hold: ``outbox demo``, ``outbox check`` (the randomized
fault-injection soak) and ``outbox status`` (the operator's view and health check)."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from outbox.cli.support import (
    EXIT_ERROR,
    CliContext,
    emit_json,
    is_terminal,
    json_option,
    pass_cli,
    print_kv,
    print_table,
    progress,
)
from outbox.core.durations import format_duration, parse_duration
from outbox.core.errors import WorkspaceError

#: ``demo`` and ``check``: an invariant broke. ``status``: see its --help.
EXIT_BROKEN = 3
EXIT_PENDING_TOO_OLD = 3
EXIT_DEAD_LETTERS = 4

_CHATTY = ("outbox.rescuer", "outbox.worker", "outbox.dispatcher", "outbox.checker")


def _quiet(verbose: bool) -> None:
    """Per-pass and per-batch INFO lines drown the story; --verbose brings them back."""
    if not verbose:
        for name in _CHATTY:
            logging.getLogger(name).setLevel(logging.WARNING)


def _stepper(as_json: bool, name: str = "outbox.demo") -> Callable[[str], None]:
    if as_json:
        log = logging.getLogger(name)
        return log.info
    if is_terminal():
        from rich.console import Console

        console = Console()
        return lambda msg: console.print(f"[bold cyan]>[/] {msg}")
    return lambda msg: click.echo(f"> {msg}")


# --- demo ------------------------------------------------------------------------------------


@click.command()
@click.option(
    "--workspace",
    "demo_workspace",
    metavar="DIR",
    help="Keep the demo's workspace in DIR (a new or empty folder). Default: a temporary folder, "
    "removed afterwards.",
)
@click.option(
    "--packages",
    type=click.IntRange(3, 2000),
    default=40,
    show_default=True,
    help="Packages to track (three status updates each).",
)
@json_option
@pass_cli
def demo(cli: CliContext, demo_workspace: str | None, packages: int, as_json: bool) -> None:
    """The shipment-tracking story: packages get ordered status updates, the dispatcher is
    SIGKILLed mid-batch, the rescuer notices after its delay (the clock is moved forward, and the
    output says so), the worker finishes, and a consumer checks every package's statuses arrived
    in order. Exit 0 when every invariant held, 3 when one broke."""
    from outbox.demo import iter_rows, run_demo

    _quiet(cli.verbose)
    target = demo_workspace
    if target is not None:
        path = Path(target)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise WorkspaceError(
                f"demo workspace {path} is not an empty folder",
                hint="pass a new folder to --workspace, or omit it for a temporary one",
            )
    report = run_demo(
        target,
        packages=packages,
        step=_stepper(as_json),
        bar=progress,
    )
    if as_json:
        emit_json(report.to_dict())
    else:
        print_kv("delta-outbox demo: shipment tracking", iter_rows(report))
        for p in report.problems:
            click.echo(f"problem: {p}")
        if report.kept:
            click.echo(
                f"workspace kept in {report.workspace}; try `outbox -w {report.workspace} status`"
            )
    if not report.ok:
        raise SystemExit(EXIT_BROKEN)


# --- check -----------------------------------------------------------------------------------


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
@json_option
@pass_cli
def check(
    cli: CliContext,
    seeds: int,
    first_seed: int,
    minutes: float,
    scale: float,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Randomized end-to-end fault injection: writer processes, run-dispatcher worker processes
    and rescuer passes under seeded crashes (every crash point, raise or SIGKILL), SIGKILLs from
    outside, broker outages, send failures and Delta commit conflicts; then I1, I2, I3, I4 and I6
    are verified with exact counts. A seed replays its fault plan. Exit 0 when every seed held,
    3 when an invariant broke."""
    from outbox.checker.report import aggregate
    from outbox.checker.run import run_check

    _quiet(cli.verbose)
    say = _stepper(as_json, "outbox.check")
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="outbox-check-"))
    deadline = time.monotonic() + minutes * 60
    reports: list[Any] = []
    seed = first_seed
    while len(reports) < seeds or time.monotonic() < deadline:
        say(f"seed {seed} ...")
        r = run_check(seed, root, scale=scale, progress=logging.getLogger("outbox.check").info)
        if not as_json:
            say(r.summary())
        if not r.ok:
            say(f"seed {seed} FAILED: its files are in {root / f'seed-{seed}'}")
        reports.append(r)
        seed += 1
    total = aggregate(reports)
    if as_json:
        emit_json({"total": total, "seeds": [r.to_dict() for r in reports]})
    else:
        print_table(
            "outbox check: per seed",
            [
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
            ],
            [
                (
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
                    f"{r.rescue_passes_failed + r.rescue_passes_interrupted}/"
                    f"{len(r.rescue_errors)}",
                    f"{r.latency_rescued['p95']:.2f}/{r.latency_rescued['max']:.2f}s",
                    f"{r.duration_s:.0f}s",
                )
                for r in reports
            ],
        )
        print_kv("outbox check: totals", [(k, v) for k, v in total.items()])
    if total["failed_seeds"]:
        raise SystemExit(EXIT_BROKEN)


# --- status ----------------------------------------------------------------------------------


@click.command()
@click.option(
    "--fail-if-pending-older-than",
    "max_pending_age",
    metavar="DURATION",
    help=f"Exit {EXIT_PENDING_TOO_OLD} when the oldest pending message is older (e.g. 5m).",
)
@click.option(
    "--fail-if-dead-letters",
    is_flag=True,
    help=f"Exit {EXIT_DEAD_LETTERS} when any queue holds dead letters.",
)
@json_option
@pass_cli
def status(
    cli: CliContext, max_pending_age: str | None, fail_if_dead_letters: bool, as_json: bool
) -> None:
    """Pending documents and messages, the oldest pending age, each rescuer's checkpoint and lag,
    queue depths and the oldest dead letter. Read-only.

    Exit codes for health checks: 0 healthy, 1 cannot read the workspace (the error says why),
    3 a pending message is older than --fail-if-pending-older-than, 4 dead letters exist and
    --fail-if-dead-letters was given."""
    from outbox.core.clock import SystemClock
    from outbox.status import collect_status

    limit = (
        parse_duration(max_pending_age, name="--fail-if-pending-older-than")
        if max_pending_age
        else None
    )
    report = collect_status(cli.settings(), SystemClock())
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_status(report)
    for problem in report.problems:
        click.echo(f"error: {problem}", err=True)
    age = report.oldest_pending_age_seconds
    if limit is not None and age is not None and age > limit:
        click.echo(
            f"unhealthy: the oldest pending message ({report.oldest_pending_document}) is "
            f"{format_duration(age)} old, over {format_duration(limit)}",
            err=True,
        )
        raise SystemExit(EXIT_PENDING_TOO_OLD)
    if fail_if_dead_letters and any(q.dead_lettered for q in report.queues):
        click.echo("unhealthy: dead letters are waiting (see `outbox dead-letters list`)", err=True)
        raise SystemExit(EXIT_DEAD_LETTERS)
    if report.problems:
        raise SystemExit(EXIT_ERROR)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def _print_status(report: Any) -> None:
    print_kv(
        "outbox status",
        [
            ("table", f"{report.table_uri} (version {report.table_version})"),
            ("database", report.sql_url),
            ("pending documents", report.pending_documents),
            ("pending messages", report.pending_messages),
            (
                "oldest pending",
                f"{_age(report.oldest_pending_age_seconds)} ({report.oldest_pending_document})"
                if report.oldest_pending_document
                else "-",
            ),
            (
                "delta log",
                f"{report.log_files} files from version {report.oldest_log_version}"
                if report.log_files is not None
                else "-",
            ),
        ],
    )
    print_table(
        "rescuer checkpoints",
        ["rescuer", "version", "lag (versions)", "lag", "last pass", "mode"],
        [
            (
                c.rescuer,
                "-" if c.version is None else c.version,
                c.lag_versions,
                _age(c.lag_seconds),
                f"{_age(c.last_pass_age_seconds)} ago" if c.last_pass_at else "never",
                c.last_mode or "-",
            )
            for c in report.checkpoints
        ]
        or [("(no rescue pass yet)", "", "", "", "", "")],
    )
    print_table(
        "queues",
        ["queue", "active", "scheduled", "locked", "dead-lettered"],
        [(q.queue, q.active, q.scheduled, q.locked, q.dead_lettered) for q in report.queues]
        or [("(empty)", "", "", "", "")],
    )
    d = report.oldest_dead_letter
    if d is not None:
        print_kv(
            "oldest dead letter",
            [
                ("id", d.id),
                ("queue", d.queue),
                ("message id", d.message_id),
                ("reason", d.reason),
                ("description", d.description),
                ("age", _age(d.age_seconds)),
            ],
        )


def register(group: click.Group) -> None:
    group.add_command(demo)
    group.add_command(check)
    group.add_command(status)

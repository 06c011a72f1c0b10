"""``outbox rescue``: one pass (for cron or a Databricks job), or ``--every 30s`` until SIGTERM."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import (
    echo,
    echo_err,
    emit_json,
    emit_json_line,
    is_terminal,
    print_kv,
    quiet_logger,
)
from outbox.app.cli.support import CliContext, json_option, pass_cli
from outbox.app.cli.telemetry_options import (
    POLL_BUDGET,
    SPARK_PASS_BUDGET,
    metrics_port_option,
    start_telemetry,
)
from outbox.core.clock import SystemClock
from outbox.core.durations import format_duration, parse_duration
from outbox.core.errors import OutboxError, ValidationError

if TYPE_CHECKING:  # the runner pulls in SQLAlchemy and deltalake: import it when a pass runs
    from rescuer.runner import PassReport

INTERRUPTED = (
    "interrupted: the pass stopped before storing its checkpoint; the next pass repeats the "
    "same window and the queue drops the commands already enqueued"
)


def _v(value: int | None) -> str:
    return "-" if value is None else str(value)


def _idle(report: PassReport) -> bool:
    return not (report.pending_documents or report.warnings or report.versions_scanned)


def _show(report: PassReport, *, as_json: bool, looping: bool, first: bool = True) -> None:
    for w in report.warnings:
        echo_err(f"WARNING: {w}")
    if as_json:
        if looping:  # one object per line, so a log shipper can split them
            emit_json_line(report.to_dict())
        else:
            emit_json(report.to_dict())
        return
    if looping and not first and _idle(report):
        return  # `rescue --every` in text: quiet while there is nothing to do (-v logs each pass)
    if not is_terminal():
        echo(report.summary())
        return
    print_kv(
        f"rescue pass ({report.engine}, {report.mode or 'nothing old enough yet'})",
        [
            ("table", report.table_uri),
            ("rescuer", report.rescuer_name),
            ("window", f"({_v(report.window_start)}, {_v(report.window_end)}]"),
            ("versions scanned", report.versions_scanned),
            ("change rows read", report.change_rows),
            ("documents examined", report.documents_examined),
            ("pending documents", report.pending_documents),
            ("commands enqueued", report.commands_enqueued),
            ("already queued (dropped)", report.duplicates_dropped),
            ("checkpoint", f"{_v(report.checkpoint_before)} -> {_v(report.checkpoint_after)}"),
            ("lag", f"{report.lag_versions} versions, {format_duration(report.lag_seconds)}"),
            ("took", format_duration(report.duration_s)),
        ],
    )


@click.command()
@click.option("--every", metavar="DURATION", help="Loop: a pass every DURATION until SIGTERM.")
@click.option("--delay", metavar="DURATION", help="Only rescue changes older than this (15s..1h).")
@click.option(
    "--engine",
    metavar="NAME",
    help="The change-feed engine: local (delta-rs) or spark (PySpark + delta-spark); default: "
    "the rescuer_engine setting (local).",
)
@click.option("--full", is_flag=True, help="Sweep every current row instead of the change feed.")
@click.option("--name", help="Rescuer name: its checkpoint is kept per table and name.")
@click.option(
    "--forget",
    is_flag=True,
    help="Delete this rescuer's checkpoint and exit. Do it for a rescuer you no longer run: the "
    "oldest checkpoint holds back log trimming and vacuum.",
)
@metrics_port_option
@json_option
@pass_cli
def rescue(
    cli: CliContext,
    *,
    metrics_port: int | None,
    every: str | None,
    delay: str | None,
    engine: str | None,
    full: bool,
    name: str | None,
    forget: bool,
    as_json: bool,
) -> None:
    """Send a ProcessDocument command for every document left pending longer than the delay."""
    if forget:
        _forget(cli, name, as_json=as_json)
        return
    from outbox.app.rescue import open_rescuer
    from rescuer.scheduler import Scheduler

    settings = cli.settings()
    delay_s = parse_duration(delay, name="--delay") if delay is not None else None
    every_s = parse_duration(every, name="--every") if every is not None else None
    if every_s is not None and every_s <= 0:  # like every other bad duration: an error (exit 1)
        raise ValidationError(
            f"--every: {every!r} is not a positive duration", hint="write it like 30s, 5m or 1h"
        )
    if metrics_port is not None and every_s is None:
        raise ValidationError(
            "--metrics-port serves a long-running rescuer", hint="add --every 30s (or drop it)"
        )
    clock = SystemClock()
    rescuer = open_rescuer(settings, engine=engine, delay=delay_s, name=name, clock=clock)
    rescue_pass = rescuer.rescue_pass
    # The pass's own INFO line would repeat the result printed on stdout.
    with quiet_logger("outbox.rescuer", cli.verbose), rescuer:
        try:
            if every_s is None:
                _show(rescue_pass.run(full=full), as_json=as_json, looping=False)
                return
            start_telemetry(
                metrics_port,
                service_name="outbox-rescuer",
                queue=rescuer.backends.command_queue(),
                queue_name=settings.command_queue,
                settings=settings,
                poll_budget=(
                    SPARK_PASS_BUDGET
                    if getattr(rescue_pass.engine, "on_a_cluster", False)
                    else POLL_BUDGET
                ),
            )
            shown = 0

            def on_report(r: PassReport) -> None:
                nonlocal shown
                _show(r, as_json=as_json, looping=True, first=shown == 0)
                shown += 1

            scheduler = Scheduler(
                rescue_pass,
                every=every_s,
                clock=clock,
                on_report=on_report,
                on_error=lambda e: echo_err(
                    f"error: {e}"
                    if isinstance(e, OutboxError)
                    else f"error: {type(e).__name__}: {e}"
                ),
            )
            scheduler.run(full_first=full)  # stops on SIGTERM/SIGINT between passes
            echo_err(f"stopped after {scheduler.passes} pass(es)")
        except KeyboardInterrupt:
            echo_err(INTERRUPTED)
            sys.exit(exit_codes.INTERRUPTED)


def _forget(cli: CliContext, name: str | None, *, as_json: bool) -> None:
    from outbox.wiring import Backends

    settings = cli.settings()
    rescuer_name = name or settings.rescuer_name
    with Backends(settings) as backends:
        found = backends.checkpoint_store().forget(settings.table_uri, rescuer_name)
    if as_json:
        emit_json({"rescuer_name": rescuer_name, "table_uri": settings.table_uri, "forgot": found})
    elif found:
        echo(f"forgot rescuer {rescuer_name!r} of {settings.table_uri}")
    else:
        echo(f"rescuer {rescuer_name!r} has no checkpoint for {settings.table_uri}")


def register(group: click.Group) -> None:
    group.add_command(rescue)

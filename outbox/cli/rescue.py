"""``outbox rescue``: one pass (for cron or a Databricks job), or ``--every 30s`` until SIGTERM."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any, cast

import click

from outbox.cli import exit_codes
from outbox.cli.output import (
    echo,
    echo_err,
    emit_json,
    emit_json_line,
    is_terminal,
    print_kv,
    quiet_logger,
)
from outbox.cli.support import CliContext, json_option, pass_cli
from outbox.cli.telemetry_options import (
    POLL_BUDGET,
    SPARK_PASS_BUDGET,
    metrics_port_option,
    start_telemetry,
)
from outbox.core.clock import SystemClock
from outbox.core.durations import format_duration, parse_duration
from outbox.core.errors import ConfigurationError, OutboxError, ValidationError
from rescuer.engines import ENGINES

if TYPE_CHECKING:  # the runner pulls in SQLAlchemy and deltalake: import it when a pass runs
    from dispatcher.queue.command_queue import CommandQueue
    from rescuer.runner import PassReport

INTERRUPTED = (
    "interrupted: the pass stopped before storing its checkpoint; the next pass repeats the "
    "same window and the queue drops the commands already enqueued"
)


def _v(value: int | None) -> str:
    return "-" if value is None else str(value)


def summary(report: PassReport) -> str:
    """One pass on one line for a log or a pipe: what it read, what it enqueued and what the
    queue already held (``already_queued``: commands the queue dropped as duplicates)."""
    return (
        f"rescue {report.table_uri} [{report.rescuer_name}/{report.engine}] "
        f"mode={report.mode or 'idle'} window=({_v(report.window_start)},"
        f"{_v(report.window_end)}] versions={report.versions_scanned} "
        f"pending_docs={report.pending_documents} enqueued={report.commands_enqueued} "
        f"already_queued={report.duplicates_dropped} "
        f"checkpoint={_v(report.checkpoint_before)}->{_v(report.checkpoint_after)} "
        f"lag={report.lag_versions}v/{format_duration(report.lag_seconds)}"
    )


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
        echo(summary(report))
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
    type=click.Choice(ENGINES),
    default="local",
    show_default=True,
    help="local (delta-rs) or spark (PySpark + delta-spark).",
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
    metrics_port: int | None,
    every: str | None,
    delay: str | None,
    engine: str,
    full: bool,
    name: str | None,
    forget: bool,
    as_json: bool,
) -> None:
    """Send a ProcessDocument command for every document left pending longer than the delay."""
    if forget:
        _forget(cli, name, as_json=as_json)
        return
    from outbox.delta.store import DeltaDocumentStore
    from rescuer.checkpoint_factory import checkpoint_store_from_settings
    from rescuer.engines import make_engine
    from rescuer.runner import RescuePass, check_delay
    from rescuer.scheduler import Scheduler
    from rescuer.sink import QueueSink

    settings = cli.settings()
    delay_s = check_delay(
        parse_duration(delay, name="--delay") if delay is not None else settings.rescue_delay
    )
    if delay_s > settings.log_retention:
        # The window end is found among the commits in the log; the trim keeps log_retention.
        raise ConfigurationError(
            f"--delay {format_duration(delay_s)} is longer than log_retention "
            f"({format_duration(settings.log_retention)}): the trimmed log would not hold a "
            "commit that old, so no pass could find its window",
            hint=f"set log_retention (OUTBOX_LOG_RETENTION) to at least {format_duration(delay_s)}"
            ", or set rescue_delay instead of --delay",
        )
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
    store = DeltaDocumentStore(
        settings.table_uri, storage_options=settings.storage_options, clock=clock
    )
    checkpoints = checkpoint_store_from_settings(settings)
    sink = QueueSink.from_settings(settings, clock=clock)
    # The pass's own INFO line would repeat the result printed on stdout.
    closers: list[Any] = [sink, checkpoints, store]
    with quiet_logger("outbox.rescuer", cli.verbose):
        try:
            rescue_pass = RescuePass(
                store,
                make_engine(engine, storage_options=settings.storage_options),
                checkpoints,
                sink,
                clock=clock,
                delay=delay_s,
                name=name or settings.rescuer_name,
            )
            if every_s is None:
                _show(rescue_pass.run(full=full), as_json=as_json, looping=False)
                return
            start_telemetry(
                metrics_port,
                service_name="outbox-rescuer",
                queue=cast("CommandQueue", sink.queue),
                queue_name=settings.command_queue,
                settings=settings,
                poll_budget=POLL_BUDGET if engine == "local" else SPARK_PASS_BUDGET,
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
        finally:
            for c in closers:
                with contextlib.suppress(OutboxError):  # best effort on shutdown
                    c.close()


def _forget(cli: CliContext, name: str | None, *, as_json: bool) -> None:
    from rescuer.checkpoint_factory import checkpoint_store_from_settings

    settings = cli.settings()
    rescuer_name = name or settings.rescuer_name
    checkpoints = checkpoint_store_from_settings(settings)
    try:
        found = checkpoints.forget(settings.table_uri, rescuer_name)
    finally:
        checkpoints.close()
    if as_json:
        emit_json({"rescuer_name": rescuer_name, "table_uri": settings.table_uri, "forgot": found})
    elif found:
        echo(f"forgot rescuer {rescuer_name!r} of {settings.table_uri}")
    else:
        echo(f"rescuer {rescuer_name!r} has no checkpoint for {settings.table_uri}")


def register(group: click.Group) -> None:
    group.add_command(rescue)

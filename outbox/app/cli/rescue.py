"""``outbox rescue``: one pass (for cron or a Databricks job), or ``--every 30s`` until SIGTERM.

A rescuer's name is the key of its checkpoint, and every checkpoint holds back the log trim and
vacuum, so names are handled with care: a name without a checkpoint needs ``--new`` (a typo must
not start a rescuer nobody runs again), an empty one is refused, and ``--forget`` needs the name
and a confirmation.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import (
    ask,
    echo,
    echo_err,
    emit_json,
    emit_json_line,
    is_terminal,
    print_kv,
    quiet_logger,
)
from outbox.app.cli.support import (
    DURATION_OR_ZERO,
    CliContext,
    Duration,
    json_option,
    pass_cli,
)
from outbox.app.cli.telemetry_options import (
    POLL_BUDGET,
    SPARK_PASS_BUDGET,
    metrics_port_option,
    start_telemetry,
)
from outbox.core.clock import Clock, SystemClock
from outbox.core.durations import format_duration
from outbox.core.errors import OutboxError, ValidationError
from outbox.core.settings import did_you_mean

if TYPE_CHECKING:  # the runner pulls in SQLAlchemy and deltalake: import it when a pass runs
    from rescuer.runner import PassReport, RescuePass

log = logging.getLogger("outbox.rescue")

#: ``--every`` given without a value: every ``rescue_interval``.
_FROM_SETTING = "\x00rescue_interval"
#: ``rescue --every`` in text says it is alive while idle at most this often: a line per idle
#: pass would drown a log at ``--every 1s``, and no line at all looked like a hang.
IDLE_LOG_INTERVAL = 300.0

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


class _LoopOutput:
    """What ``rescue --every`` shows of each pass: every one as a JSON line; in text the first and
    each that found something, and while idle one log line (stderr) at most every
    ``IDLE_LOG_INTERVAL`` by the loop's clock, saying how many passes found nothing and how far
    behind the checkpoint is."""

    def __init__(self, clock: Clock, *, as_json: bool) -> None:
        self.clock = clock
        self.as_json = as_json
        self.passes = 0
        self.idle_passes = 0
        self.quiet_since: datetime | None = None

    def __call__(self, report: PassReport) -> None:
        first = self.passes == 0
        self.passes += 1
        now = self.clock.now()
        if self.as_json or first or not _idle(report) or self.quiet_since is None:
            _show(report, as_json=self.as_json, looping=True, first=first)
            self.quiet_since, self.idle_passes = now, 0
            return
        self.idle_passes += 1
        quiet = (now - self.quiet_since).total_seconds()
        if quiet < IDLE_LOG_INTERVAL:
            return
        log.info(
            "idle: %d pass(es) in the last %s found nothing to rescue; checkpoint at version %s, "
            "lag %dv/%s",
            self.idle_passes,
            format_duration(quiet),
            _v(report.checkpoint_after),
            report.lag_versions,
            format_duration(report.lag_seconds),
        )
        self.quiet_since, self.idle_passes = now, 0


@click.command()
@click.option(
    "--every",
    type=Duration(keep=frozenset({_FROM_SETTING})),
    metavar="[DURATION]",
    is_flag=False,
    flag_value=_FROM_SETTING,
    help="Loop: a pass every DURATION until SIGTERM; `--every` alone: every rescue_interval "
    "(30s unless set).",
)
@click.option(
    "--delay", type=DURATION_OR_ZERO, help="Only rescue changes older than this (15s..1h)."
)
@click.option(
    "--engine",
    metavar="NAME",
    help="The change-feed engine: local (delta-rs) or spark (PySpark + delta-spark); default: "
    "the rescuer_engine setting (local).",
)
@click.option("--full", is_flag=True, help="Sweep every current row instead of the change feed.")
@click.option(
    "--name",
    metavar="NAME",
    help="Rescuer name: its checkpoint is kept per table and name (default: the rescuer_name "
    "setting). A name without a checkpoint needs --new.",
)
@click.option(
    "--new",
    is_flag=True,
    help="Start a rescuer under a name that has no checkpoint yet. Without it such a name is "
    "refused: a typo would start a rescuer whose checkpoint holds back log trimming and vacuum.",
)
@click.option(
    "--forget",
    is_flag=True,
    help="Delete the checkpoint of the rescuer --name names and exit (asks first). Do it for a "
    "rescuer you no longer run: the oldest checkpoint holds back log trimming and vacuum.",
)
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask before --forget (required for --forget when stdin is not a terminal).",
)
@metrics_port_option
@json_option
@pass_cli
def rescue(
    cli: CliContext,
    *,
    metrics_port: int | None,
    every: float | str | None,
    delay: float | None,
    engine: str | None,
    full: bool,
    name: str | None,
    new: bool,
    forget: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Send a ProcessDocument command for every document left pending longer than the delay."""
    if forget and new:  # options that exclude each other: the command line's shape (exit 2)
        raise click.UsageError(
            "--new and --forget exclude each other: --new starts a rescuer, --forget deletes one",
            ctx=click.get_current_context(),
        )
    if yes and not forget:
        raise click.UsageError(
            "--yes confirms --forget only (a rescue pass deletes nothing)",
            ctx=click.get_current_context(),
        )
    if forget:
        _forget(cli, name, yes=yes, as_json=as_json)
        return
    from outbox.app.rescue import open_rescuer
    from rescuer.checkpoint import check_rescuer_name

    settings = cli.settings()
    if engine is not None:  # named by the option, not by the rescuer_engine setting
        from outbox.wiring.builtin import RESCUER_ENGINES

        RESCUER_ENGINES.get(engine, named_by="--engine")
    if name is not None:
        check_rescuer_name(name)
    else:
        check_rescuer_name(settings.rescuer_name, flag="setting 'rescuer_name'")
    # `--every` alone: every rescue_interval (the setting's default when it is not set)
    every_s = settings.rescue_interval if every == _FROM_SETTING else every
    assert not isinstance(every_s, str)  # Duration read any other value into seconds
    if metrics_port is not None and every_s is None:
        raise ValidationError(
            "--metrics-port serves a long-running rescuer", hint="add --every 30s (or drop it)"
        )
    clock = SystemClock()
    rescuer = open_rescuer(settings, engine=engine, delay=delay, name=name, clock=clock)
    rescue_pass = rescuer.rescue_pass

    def sample() -> None:
        """The console's history, after each pass (one that failed too: its lag matters most)."""
        from outbox.app.sampling import record_sample

        source = f"rescuer {rescue_pass.name}"
        record_sample(
            settings, clock, source=source, backends=rescuer.backends, store=rescuer.store
        )

    # The pass's own INFO line would repeat the result printed on stdout.
    with quiet_logger("outbox.rescuer", cli.verbose), rescuer:
        _require_known(rescue_pass, new=new)
        try:
            if every_s is None:
                _show(rescue_pass.run(full=full), as_json=as_json, looping=False)
                sample()
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
            _loop(rescue_pass, every_s, clock, full=full, as_json=as_json, after_pass=sample)
        except KeyboardInterrupt:
            echo_err(INTERRUPTED)
            sys.exit(exit_codes.INTERRUPTED)


def _require_known(rescue_pass: RescuePass, *, new: bool) -> None:
    """A name without a checkpoint needs ``--new`` (see ``require_known_rescuer``)."""
    from rescuer.checkpoint import require_known_rescuer

    require_known_rescuer(rescue_pass.checkpoints, rescue_pass.table_uri, rescue_pass.name, new=new)


def _loop(
    rescue_pass: RescuePass,
    every: float,
    clock: Clock,
    *,
    full: bool,
    as_json: bool,
    after_pass: Callable[[], None],
) -> None:
    """Passes every ``every`` seconds until SIGTERM/SIGINT (between passes); ``after_pass`` runs
    after each, whether it succeeded or failed."""
    from rescuer.scheduler import Scheduler

    output = _LoopOutput(clock, as_json=as_json)

    def on_report(report: PassReport) -> None:
        output(report)
        after_pass()

    def on_error(e: Exception) -> None:
        echo_err(f"error: {e}" if isinstance(e, OutboxError) else f"error: {type(e).__name__}: {e}")
        after_pass()

    scheduler = Scheduler(
        rescue_pass, every=every, clock=clock, on_report=on_report, on_error=on_error
    )
    scheduler.run(full_first=full)  # stops on SIGTERM/SIGINT between passes
    echo_err(f"stopped after {scheduler.passes} pass(es)")


def _forget(cli: CliContext, name: str | None, *, yes: bool, as_json: bool) -> None:
    """Delete one rescuer's checkpoint: named explicitly (the default rescuer is not forgotten by
    leaving ``--name`` out), and confirmed (asked on a terminal, ``--yes`` elsewhere), because a
    rescuer that runs again afterwards starts over with a full sweep."""
    from outbox.wiring import Backends
    from rescuer.checkpoint import check_rescuer_name

    if name is None:
        raise ValidationError(
            "--forget needs --name: say which rescuer's checkpoint to delete; nothing was deleted",
            hint="outbox rescue --name NAME --forget (`outbox status` lists the rescuers)",
        )
    check_rescuer_name(name)
    settings = cli.settings()
    table = settings.table_uri
    with Backends(settings) as backends:
        store = backends.checkpoint_store()
        found = store.generation(table, name) is not None
        if found:
            if not yes:
                _confirm_forget(name, table)
            found = store.forget(table, name)
        others = [] if found else sorted(cp.rescuer_name for cp in store.list(table))
    if as_json:
        emit_json({"rescuer_name": name, "table_uri": table, "forgot": found})
    elif found:
        echo(f"forgot rescuer {name!r} of {table}")
    else:
        has = ", ".join(repr(n) for n in others) if others else "none"
        echo(
            f"rescuer {name!r} has no checkpoint for {table}; nothing was deleted (its rescuers: "
            f"{has}){did_you_mean(name, others)}"
        )


def _confirm_forget(name: str, table: str) -> None:
    answer = ask(f"delete the checkpoint of rescuer {name!r} for {table}?")
    if answer is None:
        raise ValidationError(
            f"--forget would delete the checkpoint of rescuer {name!r} and stdin is not a "
            "terminal to confirm it; nothing was deleted",
            hint="add --yes to confirm",
        )
    if not answer:
        raise ValidationError("--forget not confirmed; nothing was deleted")


def register(group: click.Group) -> None:
    group.add_command(rescue)

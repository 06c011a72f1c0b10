"""``outbox run-dispatcher``: the long-running command worker (and ``--once`` for cron/tests)."""

from __future__ import annotations

import logging

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo_err, emit_json, print_kv
from outbox.app.cli.support import DURATION, CliContext, json_option, pass_cli
from outbox.app.cli.telemetry_options import metrics_port_option, start_telemetry

log = logging.getLogger("outbox.worker")


@click.command("run-dispatcher")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Receiver threads; each holds different documents (sessions).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=32,
    show_default=True,
    help="Commands received per batch; their watermarks are written in one MERGE.",
)
@click.option("--once", is_flag=True, help="Handle what is deliverable now, then exit.")
@click.option(
    "--until-idle",
    is_flag=True,
    help="Keep going (waiting for scheduled and backed-off commands) until the queue is empty.",
)
@click.option(
    "--poll-interval",
    type=DURATION,
    default="500ms",
    show_default=True,
    help="Wait between receives when the queue has nothing ready.",
)
@click.option(
    "--max-backoff",
    type=DURATION,
    default="5m",
    show_default=True,
    help="Longest wait before a failed command is tried again (the wait doubles per failure).",
)
@metrics_port_option
@json_option
@pass_cli
def run_dispatcher(
    cli: CliContext,
    *,
    metrics_port: int | None,
    concurrency: int,
    batch_size: int,
    once: bool,
    until_idle: bool,
    poll_interval: float,
    max_backoff: float,
    as_json: bool,
) -> None:
    """Send what ProcessDocument commands name: documents left pending by a crash, a failed send,
    deferred dispatch or another writer. Stops cleanly on SIGTERM/SIGINT (exit 0).

    With --once or --until-idle the exit code tells cron how it went: 0 every command received
    was completed, 1 one was abandoned (it is retried later), dead-lettered or lost its lock."""
    if once and until_idle:  # each names when to stop: which one was meant is a guess
        raise click.UsageError(
            "--once and --until-idle exclude each other: --once stops when nothing is "
            "deliverable now, --until-idle waits for scheduled and backed-off commands too",
            ctx=click.get_current_context(),
        )
    from dispatcher.worker import DispatcherWorker
    from outbox.app.facade import Outbox
    from outbox.app.sampling import Sampler, record_sample

    settings = cli.settings()
    with Outbox.open(settings=settings, create=False) as ob:
        start_telemetry(
            metrics_port,
            service_name="outbox-dispatcher",
            queue=ob.runtime.commands,
            queue_name=settings.command_queue,
            settings=settings,
        )
        worker = DispatcherWorker(
            ob.runtime,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            backoff_max=max_backoff,
        )
        log.info(
            "run-dispatcher: queue %r (%s), table %s, concurrency %d%s",
            settings.command_queue,
            settings.command_transport,
            settings.table_uri,
            concurrency,
            " (once)" if once else " (until idle)" if until_idle else "",
        )
        # The console's history: sampled all along by a long-running worker; a cron run
        # (--once, --until-idle) leaves one sample of where it left the table.
        sampler = Sampler(settings, ob.clock, source="dispatcher")
        if not (once or until_idle):
            sampler.start()
        try:
            stats = worker.run(once=once, until_idle=until_idle)
        finally:
            sampler.stop()
        if once or until_idle:
            record_sample(
                settings, ob.clock, source="dispatcher", backends=ob.backends, store=ob.store
            )
    if as_json:
        emit_json(stats.to_dict())
    else:
        print_kv("run-dispatcher", stats.to_dict().items())
    unfinished = stats.abandoned + stats.dead_lettered + stats.lock_lost
    if (once or until_idle) and unfinished:
        echo_err(
            f"error: {unfinished} of {stats.commands} command(s) not completed ({stats.abandoned} "
            f"abandoned, {stats.dead_lettered} dead-lettered, {stats.lock_lost} lock lost) "
            "(fix: the warnings above say why; `outbox status` shows what is left)"
        )
        raise SystemExit(exit_codes.ERROR)


def register(group: click.Group) -> None:
    group.add_command(run_dispatcher)

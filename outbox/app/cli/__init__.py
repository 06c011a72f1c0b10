"""The ``outbox`` command: one click group, one module per command (or command group).

Command modules import the heavy machinery (Delta, SQLAlchemy, the runtime) inside their command
functions, so ``outbox --help`` stays fast. Output goes through :mod:`outbox.app.cli.output`, exit
codes come from :mod:`outbox.app.cli.exit_codes`.
"""

from __future__ import annotations

import click

from outbox.app.cli import (
    check,
    console,
    dead_letters,
    demo,
    devices,
    dispatcher,
    erase,
    gateway,
    keys,
    maintain,
    migrate,
    operators,
    queues,
    replay,
    rescue,
    sql,
    status,
    trace,
)
from outbox.app.cli.output import setup_logging
from outbox.app.cli.support import CliContext, OutboxGroup, not_empty
from outbox.app.cli.telemetry_options import use_log_format
from outbox.core.shadowing import check_top_level_packages


@click.group(cls=OutboxGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--workspace",
    "-w",
    envvar="OUTBOX_WORKSPACE",
    metavar="DIR",
    callback=not_empty,
    help="Workspace folder (Delta table + SQLite). Default ./.outbox.",
)
@click.option(
    "--config",
    envvar="OUTBOX_CONFIG",
    metavar="FILE",
    callback=not_empty,
    help="Settings file (TOML). Default <workspace>/outbox.toml.",
)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors on stderr.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="OUTBOX_LOG_FORMAT",
    help="json: one object per log line, with the trace id when there is a span.",
)
@click.version_option(package_name="delta-outbox")
@click.pass_context
def main(
    ctx: click.Context,
    *,
    workspace: str | None,
    config: str | None,
    verbose: bool,
    quiet: bool,
    log_format: str,
) -> None:
    """delta-outbox: a transactional outbox on Delta Lake with a change-feed rescuer."""
    setup_logging(verbose, quiet=quiet)
    use_log_format(log_format)
    check_top_level_packages()  # a user's dispatcher.py beside the program: one line, not a trace
    ctx.obj = CliContext(workspace=workspace, config=config, verbose=verbose)


# --- command registration, explicit: one module per command or command group -------------------
for _module in (
    migrate,
    maintain,
    dispatcher,
    gateway,
    devices,
    queues,
    keys,
    dead_letters,
    rescue,
    demo,
    check,
    status,
    console,
    replay,
    sql,
    erase,
    trace,
    operators,
):
    _module.register(main)


if __name__ == "__main__":  # pragma: no cover
    main()

"""The ``outbox`` command: one click group; each area registers its commands below."""

from __future__ import annotations

import click

from outbox.cli.admin import register as register_core
from outbox.cli.dispatcher import register as register_dispatcher
from outbox.cli.proofs import register as register_proofs
from outbox.cli.queues import register as register_queue
from outbox.cli.rescue import register as register_rescuer
from outbox.cli.support import CliContext, OutboxGroup, setup_logging


@click.group(cls=OutboxGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--workspace",
    "-w",
    envvar="OUTBOX_WORKSPACE",
    help="Workspace folder (Delta table + SQLite). Default ./.outbox.",
)
@click.option(
    "--config",
    envvar="OUTBOX_CONFIG",
    help="Settings file (TOML). Default <workspace>/outbox.toml.",
)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@click.version_option(package_name="delta-outbox")
@click.pass_context
def main(ctx: click.Context, workspace: str | None, config: str | None, verbose: bool) -> None:
    """delta-outbox: a transactional outbox on Delta Lake with a change-feed rescuer."""
    setup_logging(verbose)
    ctx.obj = CliContext(workspace=workspace, config=config, verbose=verbose)


# --- command registration: each area owns its commands -----------------------------------------
for _register in (
    register_core,
    register_dispatcher,
    register_queue,
    register_rescuer,
    register_proofs,
):
    _register(main)


if __name__ == "__main__":  # pragma: no cover
    main()

"""The ``outbox`` command: one click group; each area registers its commands below."""

from __future__ import annotations

import click

from dispatcher.queue_cli import register as register_queue
from dispatcher.worker_cli import register as register_dispatcher
from outbox.cli_core import register as register_core
from outbox.cli_proofs import register as register_proofs
from outbox.cli_support import CliContext, OutboxGroup, setup_logging
from rescuer.rescue_cli import register as register_rescuer


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

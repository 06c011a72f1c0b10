"""The ``outbox`` command: one click group; each area registers its commands below."""

from __future__ import annotations

import click

from outbox.cli_support import CliContext, OutboxGroup, setup_logging


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


# --- command registration (one line per area) ---------------------------------------------------
from outbox.cli_core import register as _register_core  # noqa: E402

_register_core(main)
from dispatcher.worker_cli import register as _register_dispatcher  # noqa: E402

_register_dispatcher(main)
from dispatcher.queue_cli import register as _register_queue  # noqa: E402

_register_queue(main)
from outbox.cli_proofs import register as _register_proofs  # noqa: E402

_register_proofs(main)
from rescuer.rescue_cli import register as _register_rescuer  # noqa: E402

_register_rescuer(main)


if __name__ == "__main__":  # pragma: no cover
    main()

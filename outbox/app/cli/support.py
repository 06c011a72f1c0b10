"""What every CLI command shares besides its output: the workspace context, the ``--json`` flag,
and turning ``OutboxError``, usage mistakes and Ctrl-C into one clear line and an exit code
(:mod:`outbox.app.cli.exit_codes`). Writing goes through :mod:`outbox.app.cli.output`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo_err
from outbox.core.errors import OutboxError
from outbox.core.settings import Settings

if TYPE_CHECKING:  # the queue pulls in SQLAlchemy: import it when a command runs, not for --help
    from dispatcher.queue.sql_queue import SqlQueue

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    workspace: str | None
    config: str | None
    verbose: bool = False

    def settings(self, **overrides: Any) -> Settings:
        """The settings, with every backend they name known and its settings present (a typo
        in ``transport`` fails here, for every command, not when the backend is first used)."""
        from outbox.wiring import check

        settings = Settings.load(self.workspace, config_file=self.config, **overrides)
        check(settings)
        return settings


def _set_workspace(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    cli = ctx.find_object(CliContext)
    if value is not None and cli is not None:
        cli.workspace = value


def _add_workspace_option(command: click.Command) -> None:
    """Give ``command`` (and, for a group, each of its commands) the group's ``--workspace/-w``,
    so ``outbox status -w X`` works like ``outbox -w X status``. A command with an option of that
    name of its own (``demo --workspace``) keeps it."""
    taken = {o for p in command.params for o in getattr(p, "opts", [])}
    if not taken & {"--workspace", "-w"}:
        command.params.append(
            click.Option(
                ["--workspace", "-w"],
                metavar="DIR",
                expose_value=False,
                callback=_set_workspace,
                help="Workspace folder (the same as `outbox -w DIR` before the command).",
            )
        )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_workspace_option(sub)


class OutboxGroup(click.Group):
    """A click group that prints ``OutboxError`` as one line (no traceback) with exit code 1, and
    accepts ``--workspace/-w`` before or after the command name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _add_workspace_option(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OutboxError as e:
            echo_err(f"error: {e}")
            ctx.exit(exit_codes.ERROR)
        except click.UsageError as e:
            # A bad option value of a subcommand: one line, like every other user mistake,
            # instead of click's three-line usage block (exit code 2 stays click's).
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            echo_err(f"error: {e.format_message()} (see `{where} --help`)")
            ctx.exit(exit_codes.USAGE)
        except KeyboardInterrupt:
            echo_err("interrupted: stopped before finishing; nothing committed was lost")
            ctx.exit(exit_codes.INTERRUPTED)
        except (click.exceptions.Exit, click.Abort, click.ClickException):
            raise
        except Exception as e:
            # A failure no adapter translated (a driver's own exception): during an incident the
            # operator still gets one line; -v keeps the traceback for a bug report.
            obj = ctx.find_object(CliContext)
            if obj is not None and obj.verbose:
                raise
            first = (str(e).splitlines() or [""])[0]
            echo_err(
                f"error: unexpected {type(e).__name__}: {first} (fix: rerun with -v for the "
                "traceback, and report it if nothing in the workspace explains it)"
            )
            ctx.exit(exit_codes.ERROR)


def json_option(f: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print one JSON document on stdout (for scripts); logs stay on stderr.",
    )(f)


def pass_cli(f: F) -> F:
    return click.pass_obj(f)  # type: ignore[return-value]


@contextmanager
def open_queue(cli: CliContext) -> Iterator[SqlQueue]:
    """The SQL queue named by the settings' ``sql_url``, closed afterwards. A missing or
    un-migrated database is a ``QueueError`` telling the user to run ``outbox migrate``."""
    from dispatcher.queue.sql_queue import SqlQueue

    queue = SqlQueue.from_settings(cli.settings())
    try:
        yield queue
    finally:
        queue.close()

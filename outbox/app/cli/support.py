"""What every CLI command shares besides its output: the workspace context, the ``--json`` flag,
and turning ``OutboxError``, usage mistakes and Ctrl-C into one clear line and an exit code
(:mod:`outbox.app.cli.exit_codes`). Writing goes through :mod:`outbox.app.cli.output`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import OutputClosed, discard_closed_output, echo_err
from outbox.core.durations import parse_duration
from outbox.core.errors import OutboxError, ValidationError
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


def not_empty(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A path option given as ``''`` (an unset shell variable, ``-w "$WS"``) is a mistake to
    say, not a request for the default: ``-w ''`` used to run on ./.outbox without a word."""
    if value is not None and not value.strip():
        raise click.BadParameter(
            "an empty path names no file or folder (leave the option out for the default)"
        )
    return value


def _set_workspace(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    cli = ctx.find_object(CliContext)
    value = not_empty(ctx, param, value)
    if value is not None and cli is not None:
        cli.workspace = value


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 only
    """A duration option (``500ms``, ``30s``, ``5m``, ``1h30m``), read into seconds.

    One type for every such option, so each shows DURATION in ``--help`` and refuses the same
    values: a number without a unit (``5``: milliseconds? minutes?), a negative one and, with
    ``positive`` (a wait, an interval, a lifetime), zero. A bad value is a ``ValidationError``
    (exit 1, one ``error:`` line), like the same value in a settings file, not click's usage
    error.

    ``keep``: values passed on as they are, such as the ``flag_value`` of an option whose value
    may be left out (``rescue --every`` alone: "the setting's interval"), which click converts
    like a value given."""

    name = "duration"

    def __init__(self, *, positive: bool = True, keep: frozenset[str] = frozenset()) -> None:
        self.positive = positive
        self.keep = keep

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.keep:
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)  # seconds already: a default written as a number
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        name = max(opts, key=len) if opts else "duration"
        seconds = parse_duration(str(value), name=name, need_unit=True)
        if self.positive and seconds <= 0:
            raise ValidationError(
                f"{name}: {value!r} is not a positive duration", hint="write it like 30s, 5m or 1h"
            )
        return seconds


#: A wait, an interval or a lifetime: above zero.
DURATION = Duration()
#: A duration where zero means something (``--fail-if-pending-older-than 0s``: any pending).
DURATION_OR_ZERO = Duration(positive=False)


#: The most rows a listing command reads in one go.
MAX_LIMIT = 1_000_000


def limit_option(default: int, help_text: str | None = None) -> Callable[[F], F]:
    """``--limit/-n``: how many rows to read, at most ``MAX_LIMIT``. Unbounded, a typo such as
    ``99999999999999999999`` reached the database as an integer no column holds."""
    return click.option(
        "--limit",
        "-n",
        default=default,
        show_default=True,
        type=click.IntRange(1, MAX_LIMIT),
        help=help_text,
    )


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
    """A click group that prints ``OutboxError`` as one line (no traceback) with exit code 1, a
    malformed command line (its own options' or a command's) as one line with exit code 2, ends
    quietly with 141 when the reader of the output goes away, and accepts ``--workspace/-w``
    before or after the command name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _add_workspace_option(cmd)
        super().add_command(cmd, name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Around everything, the error lines included: a closed stdout or stderr ends the
        command quietly (``exit_codes.BROKEN_PIPE``) wherever it is noticed."""
        try:
            return super().main(*args, **kwargs)
        except OutputClosed as closed:
            discard_closed_output(closed)
            sys.exit(exit_codes.BROKEN_PIPE)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """The group's own options (``outbox --log-format xml status``): a mistake there is one
        line too, not click's usage block."""
        try:
            return super().parse_args(ctx, args)
        except _HELP_NOT_ERROR:
            raise
        except click.UsageError as e:
            _usage_error(ctx, e)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OutboxError as e:
            echo_err(f"error: {e}")
            ctx.exit(exit_codes.ERROR)
        except _HELP_NOT_ERROR:
            raise  # `outbox queue` alone: click prints the group's help
        except click.UsageError as e:
            # A bad option value of a subcommand: one line, like every other user mistake,
            # instead of click's three-line usage block (exit code 2 stays click's).
            _usage_error(ctx, e)
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


#: click >= 8.2 raises this for a group called without a command: its help, not a mistake.
_HELP_NOT_ERROR: tuple[type[BaseException], ...] = tuple(
    e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if e is not None
)


def _usage_error(ctx: click.Context, e: click.UsageError) -> NoReturn:
    where = e.ctx.command_path if e.ctx is not None else ctx.command_path
    echo_err(f"error: {e.format_message()} (see `{where} --help`)")
    ctx.exit(exit_codes.USAGE)


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

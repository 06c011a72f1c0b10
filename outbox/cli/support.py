"""What every CLI command shares: the workspace context, output (rich on a terminal, plain logs
otherwise, JSON with ``--json``), and turning ``OutboxError`` into one clear line and exit code."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from outbox.core.errors import OutboxError
from outbox.core.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass
class CliContext:
    workspace: str | None
    config: str | None
    verbose: bool = False

    def settings(self, **overrides: Any) -> Settings:
        return Settings.load(self.workspace, config_file=self.config, **overrides)


def is_terminal() -> bool:
    return sys.stdout.isatty()


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=json_default, indent=2, sort_keys=True))


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A rich table on a terminal; tab-separated plain text otherwise (easy to grep)."""
    rows = [[("" if v is None else str(v)) for v in r] for r in rows]
    if is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for c in columns:
            table.add_column(c)
        for r in rows:
            table.add_row(*r)
        Console().print(table)
    else:
        click.echo(f"# {title}")
        click.echo("\t".join(columns))
        for r in rows:
            click.echo("\t".join(r))


def print_kv(title: str, pairs: Iterable[tuple[str, Any]]) -> None:
    print_table(title, ["field", "value"], [(k, v) for k, v in pairs])


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``: a rich progress bar on a terminal, a log line per 10% otherwise."""
    if is_terminal():
        from rich.progress import Progress

        with Progress(transient=False) as p:
            task = p.add_task(description, total=total)

            def advance_bar(n: int = 1) -> None:
                p.advance(task, n)

            yield advance_bar
        return
    log = logging.getLogger("outbox")
    done = 0
    step = max(1, (total or 10) // 10)
    next_at = step

    def advance(n: int = 1) -> None:
        nonlocal done, next_at
        done += n
        if done >= next_at:
            log.info("%s: %d/%s", description, done, total if total is not None else "?")
            next_at = done + step

    yield advance
    log.info("%s: done (%d)", description, done)


class OutboxGroup(click.Group):
    """A click group that prints ``OutboxError`` as one line (no traceback) with exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OutboxError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(EXIT_ERROR)
        except click.UsageError as e:
            # A bad option value of a subcommand: one line, like every other user mistake,
            # instead of click's three-line usage block (exit code 2 stays click's).
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            click.echo(f"error: {e.format_message()} (see `{where} --help`)", err=True)
            ctx.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo(
                "interrupted: stopped before finishing; nothing committed was lost", err=True
            )
            ctx.exit(EXIT_INTERRUPTED)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(f)


def pass_cli(f: F) -> F:
    return click.pass_obj(f)  # type: ignore[return-value]


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

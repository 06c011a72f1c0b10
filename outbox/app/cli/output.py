"""Everything the ``outbox`` command writes goes through here, so every command behaves alike.

The contract (scripts rely on it):

* **stdout carries the result, stderr everything else.** Logs (``--verbose`` for debug), warnings,
  ``error: ...`` lines and ``unhealthy: ...`` lines go to stderr; a script can pipe stdout
  without filtering.
* **``--json``**: stdout holds exactly one JSON document, pretty-printed with sorted keys: an
  object for every command, except the list commands (``queue peek``, ``dead-letters list``),
  which print an array of objects. Datetimes are ISO 8601 strings, bytes are UTF-8 text. A
  duration or an age is a number of seconds and its key ends in ``_s`` (``duration_s``,
  ``lag_s``, ``oldest_pending_age_s``): see :func:`unit_keys`. The one stream is
  ``rescue --every --json``: one compact object per pass, one per line (JSON Lines), so a log
  shipper can split them.
* **Without ``--json``**: on a terminal, rich tables and progress bars; piped or redirected,
  plain text with aligned columns (``# title``, a header row, then one row per line; columns are
  separated by at least two spaces) and progress as log lines on stderr.
* **A reader that stops reading** (``outbox status | head -1``) ends the command quietly with
  exit code 141 (:data:`exit_codes.BROKEN_PIPE`), as it ends ``yes`` or ``git log``: every
  write here turns the broken pipe into :class:`OutputClosed`.

Rich is imported only when a terminal is there to draw on: ``outbox --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from outbox.core.durations import unit_keys

#: Loggers whose per-pass and per-batch INFO lines drown a story; ``--verbose`` keeps them.
CHATTY_LOGGERS = ("outbox.rescuer", "outbox.worker", "outbox.dispatcher", "outbox.app.checker")
_NOISY_LIBRARIES = ("py4j", "alembic", "urllib3")
#: Rust targets quiet even with ``-v`` (an env_logger filter): the AWS SDK's credential chain
#: warns once per source it tries (the metadata endpoint, profiles) before every "no credentials"
#: error, which our own error line replaces with the settings to set.
QUIET_RUST_LOGGERS = "aws_config=error"
_GAP = "  "


def setup_logging(verbose: bool, *, quiet: bool = False) -> None:
    """Logs go to stderr (stdout is the result's): INFO by default, DEBUG with ``--verbose``,
    WARNING with ``--quiet`` (for cron: only what needs a look)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in _NOISY_LIBRARIES:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # deltalake's Rust side logs to stderr by itself (env_logger, read when deltalake is first
    # imported, which the commands do later): without credentials the AWS SDK prints WARN lines
    # about the metadata endpoint before our one-line error (issue 32), which already says what
    # to set. -v keeps Rust's other warnings, not those. A RUST_LOG the user set is kept.
    os.environ.setdefault("RUST_LOG", f"warn,{QUIET_RUST_LOGGERS}" if verbose else "off")


def quiet_chatty_loggers(verbose: bool) -> None:
    """For the commands that tell a story (demo, check): only warnings from the busy loggers."""
    if not verbose:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def quiet_logger(name: str, verbose: bool) -> Iterator[None]:
    """Within the block, only warnings from ``name`` unless ``--verbose``: for a command whose
    result on stdout would otherwise be repeated by that logger's INFO line on stderr. The level
    is put back afterwards (the CLI also runs in-process, under tests)."""
    logger = logging.getLogger(name)
    before = logger.level
    if not verbose:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(before)


def is_terminal() -> bool:
    return sys.stdout.isatty()


def ask(question: str) -> bool | None:
    """A yes/no question on the terminal (the prompt on stderr: stdout stays the result's);
    None when stdin is not a terminal, so nobody could answer."""
    if not sys.stdin.isatty():
        return None
    return click.confirm(question, default=False, err=True)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def snake_case(name: str) -> str:
    """A ``--json`` key in the one key style: ``I1 no loss`` -> ``i1_no_loss``, deltalake's
    ``numFilesAdded`` -> ``num_files_added``."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def snake_keys(data: dict[str, Any], *fields: str) -> dict[str, Any]:
    """``data`` with the keys of the mappings under ``fields`` in snake_case: names made for
    people (invariants) or by a library (deltalake's metrics) are keys like every other one."""
    out = dict(data)
    for f in fields:
        if isinstance(out.get(f), dict):
            out[f] = {snake_case(str(k)): v for k, v in out[f].items()}
    return out


def emit_json(data: Any) -> None:
    """The ``--json`` result: one JSON document on stdout (pretty, sorted keys)."""
    _write(json.dumps(unit_keys(data), default=json_default, indent=2, sort_keys=True))


def emit_json_line(data: Any) -> None:
    """One compact JSON object on one stdout line: for commands that report repeatedly."""
    _write(json.dumps(unit_keys(data), default=json_default, sort_keys=True))


def echo(line: str) -> None:
    """A line of the result for a person (stdout)."""
    _write(line)


def echo_err(line: str) -> None:
    """A line about the run rather than its result (stderr): errors, warnings, health verdicts."""
    _write(line, err=True)


class OutputClosed(BaseException):
    """The reader of stdout (or stderr) went away: ``outbox status | head -1`` once ``head`` has
    its line. A ``BaseException``, like ``KeyboardInterrupt``, so no command's ``except
    Exception`` takes it for a failure of its own work (a rescue loop would report it every
    pass); the CLI ends quietly with ``exit_codes.BROKEN_PIPE``."""

    def __init__(self, err: bool) -> None:
        super().__init__("stderr" if err else "stdout")
        self.err = err


def _write(text: str, *, err: bool = False) -> None:
    try:
        click.echo(text, err=err)
    except BrokenPipeError as e:
        raise OutputClosed(err) from e


def discard_closed_output(closed: OutputClosed) -> None:
    """Point the closed stream at /dev/null: what is still buffered for it would otherwise fail
    again when Python flushes it at exit, and print "Exception ignored ... BrokenPipeError"."""
    stream = sys.stderr if closed.err else sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture into memory)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def text_value(value: Any) -> str:
    """A value as a person reads it: no Python reprs in text output (``yes``/``no``, not
    ``True``; ``a=1, b=2``, not ``{'a': 1}``; nothing for None)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={text_value(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(text_value(v) for v in value) or "-"
    return _scalar_text(value)


def _scalar_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _cells(rows: Iterable[Sequence[Any]]) -> list[list[str]]:
    return [[text_value(v) for v in r] for r in rows]


def aligned(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines of left-aligned columns, at least two spaces apart, no trailing blanks."""
    table = [list(columns), *[list(r) for r in rows]]
    widths = [max(len(r[i]) if i < len(r) else 0 for r in table) for i in range(len(columns))]
    return [
        _GAP.join(cell.ljust(width) for cell, width in zip(r, widths, strict=False)).rstrip()
        for r in table
    ]


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A rich table on a terminal; aligned plain text otherwise (readable in a pipe or a log)."""
    cells = _cells(rows)
    if is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for c in columns:
            table.add_column(c)
        for r in cells:
            table.add_row(*r)
        Console().print(table)
        return
    _write(f"# {title}")
    for line in aligned(columns, cells):
        _write(line)


def print_kv(title: str, pairs: Iterable[tuple[str, Any]]) -> None:
    """A record as a two-column table (field, value). A field named like a ``--json`` key reads
    as it does there (``vacuum_retention_hours`` 2 is ``vacuum_retention_s`` 7200): text and
    JSON name a value alike."""
    rows = [row for k, v in pairs for row in unit_keys({k: v}).items()]
    print_table(title, ["field", "value"], rows)


def stepper(as_json: bool, logger: str) -> Callable[[str], None]:
    """The narration of a long command: ``> step`` lines (cyan on a terminal); with ``--json``
    they become log lines on stderr, so stdout keeps only the JSON document."""
    if as_json:
        return logging.getLogger(logger).info
    if is_terminal():
        from rich.console import Console

        console = Console()
        return lambda msg: console.print(f"[bold cyan]>[/] {msg}")
    return lambda msg: _write(f"> {msg}")


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

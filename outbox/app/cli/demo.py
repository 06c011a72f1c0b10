"""``outbox demo``: the shipment-tracking story that shows the guarantees hold end to end."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from outbox.app.cli import exit_codes
from outbox.app.cli.output import (
    echo,
    echo_err,
    emit_json,
    print_kv,
    progress,
    quiet_chatty_loggers,
    snake_keys,
    stepper,
)
from outbox.app.cli.support import CliContext, json_option, pass_cli
from outbox.core.errors import WorkspaceError

if TYPE_CHECKING:
    from outbox.app.demos.frame import StoryReport

#: Every story narrates on one logger (``--json`` turns its steps into log lines).
STEP_LOGGER = "outbox.app.demos.shipments"


@click.command()
@click.argument("story", required=False, type=click.Choice(["geo", "devices"]))
@click.option(
    "--workspace",
    "-w",
    "demo_workspace",
    metavar="DIR",
    help="Keep the demo's workspace in DIR (a new or empty folder). Default: a temporary folder, "
    "removed afterwards.",
)
@click.option(
    "--packages",
    type=click.IntRange(3, 2000),
    default=40,
    show_default=True,
    help="Packages to track (three status updates each).",
)
@json_option
@pass_cli
def demo(
    cli: CliContext, story: str | None, demo_workspace: str | None, packages: int, as_json: bool
) -> None:
    """The shipment-tracking story: packages get ordered status updates, the dispatcher is
    SIGKILLed mid-batch, the rescuer notices after its delay (the clock is moved forward unless
    the save took that long; the output says which), the worker finishes, and a consumer checks
    every package's statuses arrived in order. `outbox demo geo`: the same packages across two
    regions (two queues, one claim log), the east region failing mid-run. `outbox demo devices`:
    door terminals served one task at a time over MQTT (a local mosquitto), one offline while its
    tasks wait, then in order. Exit 0 when every invariant held, 5 when one broke, 130 on Ctrl-C
    (children stopped, a temporary workspace removed)."""
    quiet_chatty_loggers(cli.verbose)
    target = demo_workspace
    here = click.get_current_context()
    root = here.find_root()
    if target is None and root.get_parameter_source("workspace") is ParameterSource.COMMANDLINE:
        target = cli.workspace  # `outbox -w DIR demo`: DIR, as for every other command
    if target is not None:
        path = Path(target)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise WorkspaceError(
                f"demo workspace {path} is not an empty folder",
                hint="pass a new folder to -w/--workspace, or omit it for a temporary one",
            )
    try:
        with _ctrl_c() as ctrl_c:
            _run(story, target, packages=packages, as_json=as_json, ctrl_c=ctrl_c)
    except KeyboardInterrupt:
        # The story stopped its children and threads on the way out (outbox.app.demos.frame).
        where = (
            "its temporary workspace was removed"
            if target is None
            else f"what it did so far is in {target}"
        )
        echo_err(f"interrupted: the demo stopped before finishing; {where}")
        raise SystemExit(exit_codes.INTERRUPTED) from None


class _CtrlC:
    """Whether Ctrl-C was pressed; ``check()`` raises ``KeyboardInterrupt`` if so."""

    def __init__(self) -> None:
        self.pressed = False

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt


@contextmanager
def _ctrl_c() -> Iterator[_CtrlC]:
    """Ctrl-C as a ``KeyboardInterrupt`` that is never lost. Python raises it wherever the main
    thread is; inside a callback of the garbage collector (SQLAlchemy has some) it is printed as
    "Exception ignored ... KeyboardInterrupt" with a traceback and dropped, and the demo went on.
    So the handler also records it, such a drop stays silent, and the story checks the record at
    each step and at its end."""
    state = _CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        state.pressed = True
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        if not (state.pressed and isinstance(info.exc_value, KeyboardInterrupt)):
            hook(info)

    hook = sys.unraisablehook
    before = signal.signal(signal.SIGINT, handler)
    sys.unraisablehook = unraisable
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, before)
        sys.unraisablehook = hook


def _run(
    story: str | None, target: str | None, *, packages: int, as_json: bool, ctrl_c: _CtrlC
) -> None:
    """Tell ``story`` in ``target`` (None: a temporary folder)."""
    from outbox.app.demos.shipments import iter_rows, run_demo

    here = click.get_current_context()
    say = stepper(as_json, STEP_LOGGER)

    def step(line: str) -> None:
        ctrl_c.check()
        say(line)

    if story == "geo":
        from outbox.app.demos.geo import iter_rows as geo_rows
        from outbox.app.demos.geo import run_geo_demo

        geo = run_geo_demo(target, packages=packages, step=step)
        ctrl_c.check()
        title = "delta-outbox demo geo: shipment tracking across two regions"
        _tell(geo, title, geo_rows(geo), as_json)
        return
    if story == "devices":
        from outbox.app.demos.devices import iter_rows as devices_rows
        from outbox.app.demos.devices import run_devices_demo

        if here.get_parameter_source("packages") is ParameterSource.COMMANDLINE:
            raise click.UsageError("--packages does not apply to `demo devices` (it has no size)")

        fleet = run_devices_demo(target, step=step)
        ctrl_c.check()
        title = "delta-outbox demo devices: one task at a time per device"
        _tell(fleet, title, devices_rows(fleet), as_json, then="devices list")
        return
    report = run_demo(target, packages=packages, step=step, bar=progress)
    ctrl_c.check()
    title = "delta-outbox demo: shipment tracking"
    _tell(report, title, iter_rows(report), as_json, then="status")


def _tell(
    report: StoryReport,
    title: str,
    rows: Iterable[tuple[str, str]],
    as_json: bool,
    *,
    then: str = "",
) -> None:
    """A story's report, told the way every story's is: the JSON document, or the summary table,
    its problems and where the workspace was kept (``then``: the command to try on it next);
    exit 5 when an invariant broke."""
    if as_json:
        emit_json(snake_keys(report.to_dict(), "invariants", "not_exercised"))
    else:
        print_kv(title, rows)
        for p in report.problems:
            echo(f"problem: {p}")
        if report.kept:
            ws = report.workspace
            echo(f"workspace kept in {ws}" + (f"; try `outbox -w {ws} {then}`" if then else ""))
    if not report.ok:
        raise SystemExit(exit_codes.INVARIANT_BROKEN)


def register(group: click.Group) -> None:
    group.add_command(demo)

"""``outbox demo devices``: the door-terminal story (``outbox.app.demos.devices``), printed the way
every demo prints; ``outbox.app.cli.demo`` hands the ``devices`` story here."""

from __future__ import annotations

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo, emit_json, print_kv, snake_keys, stepper


def devices_story(target: str | None, as_json: bool) -> None:
    from outbox.app.demos.devices import iter_rows, run_devices_demo

    report = run_devices_demo(target, step=stepper(as_json, "outbox.app.demos.shipments"))
    if as_json:
        emit_json(snake_keys(report.to_dict(), "invariants"))
    else:
        print_kv("delta-outbox demo devices: one task at a time per device", iter_rows(report))
        for p in report.problems:
            echo(f"problem: {p}")
        if report.kept:
            ws = report.workspace
            echo(f"workspace kept in {ws}; try `outbox -w {ws} devices list`")
    if not report.ok:
        raise SystemExit(exit_codes.INVARIANT_BROKEN)

"""``outbox maintain``: the table's upkeep (compaction, checkpoint, log trim, vacuum) and every
other item of the retention registry (``outbox.app.retention``)."""

from __future__ import annotations

import click

from outbox.app.cli.output import emit_json, print_kv, print_table, snake_keys
from outbox.app.cli.support import DURATION, CliContext, json_option, pass_cli
from outbox.core.clock import SystemClock


@click.command()
@click.option("--no-compact", is_flag=True, help="Skip compaction.")
@click.option("--no-checkpoint", is_flag=True, help="Skip writing a Delta checkpoint.")
@click.option(
    "--vacuum",
    "vacuum",
    type=DURATION,
    help="Also vacuum files older than DURATION (e.g. 168h). Refused when the rescuer still "
    "needs that history.",
)
@click.option(
    "--no-trim-log",
    is_flag=True,
    help="Skip trimming the Delta log (commit files older than log_retention, never past the "
    "oldest rescuer checkpoint).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Change nothing: report what vacuum and the log trim would delete (no compaction, no "
    "checkpoint).",
)
@click.option(
    "--repair",
    is_flag=True,
    help="Rewrite the buckets whose document versions are held by two rows (left by two "
    "compactions at once), keeping one; saves of such documents are refused until then.",
)
@json_option
@pass_cli
def maintain(
    cli: CliContext,
    *,
    no_compact: bool,
    no_checkpoint: bool,
    vacuum: float | None,
    no_trim_log: bool,
    dry_run: bool,
    repair: bool,
    as_json: bool,
) -> None:
    """Fold superseded versions, compact small files, write a checkpoint, trim the Delta log
    and (optionally) vacuum, never deleting history the rescuer still needs; report (and with
    --repair, repair) document versions held by two rows; prune the queue's expired
    duplicate-detection ids, inbox records older than inbox_retention, dead letters, finished
    geo claims and samples past their retention (docs/operations.md, "Retention")."""
    from outbox.app.maintenance import MaintenanceOptions, forget_old_records
    from outbox.app.maintenance import maintain as run
    from outbox.wiring.backends import open_document_store

    settings = cli.settings()
    store = open_document_store(settings)
    clock = SystemClock()
    report = run(
        store,
        clock=clock,
        sql_url=settings.sql_url,
        rescue_delay_seconds=settings.rescue_delay,
        storage_options=settings.storage_options,
        settings=settings,
        options=MaintenanceOptions(
            do_compact=not (no_compact or dry_run),  # a dry run writes nothing
            do_checkpoint=not (no_checkpoint or dry_run),
            vacuum_retention_seconds=vacuum,
            dry_run=dry_run,
            log_retention_seconds=None if no_trim_log else settings.log_retention,
            repair=repair,
        ),
    )
    result = snake_keys(report.to_dict(), "compacted")
    result.update(forget_old_records(settings, clock=clock, dry_run=dry_run, upkeep=result))
    if as_json:
        emit_json(result)
    else:
        items = result.pop("retention")
        print_kv("maintenance", result.items())
        print_table(
            "retention (what went)",
            ["kept", "setting", "deleted"],
            [
                (i["item"], i["setting"], "-" if i["deleted"] is None else i["deleted"])
                for i in items
            ],
        )


def register(group: click.Group) -> None:
    group.add_command(maintain)

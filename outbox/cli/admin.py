"""Core commands: ``migrate`` and ``maintain``."""

from __future__ import annotations

import click

from outbox.cli.support import CliContext, emit_json, json_option, pass_cli, print_kv
from outbox.core.clock import SystemClock
from outbox.core.durations import parse_duration
from outbox.core.errors import ValidationError
from outbox.core.settings import Settings


@click.command()
@click.option("--sql-url", help="SQL database URL (default: SQLite in the workspace).")
@click.option("--table", "table_uri", help="Delta table location (default: <workspace>/documents).")
@click.option("--buckets", type=int, help="Bucket partitions for a new table (default 16).")
@json_option
@pass_cli
def migrate(
    cli: CliContext,
    sql_url: str | None,
    table_uri: str | None,
    buckets: int | None,
    as_json: bool,
) -> None:
    """Create or upgrade the Delta table and the SQL schema. Safe to run twice."""
    from migrations.runner import migrate as run

    settings = cli.settings(sql_url=sql_url, table_uri=table_uri, buckets=buckets)
    report = run(settings)
    if as_json:
        emit_json(report.to_dict())
        return
    if not report.actions:
        click.echo(f"already up to date: {settings.table_uri} and {report.to_dict()['sql_url']}")
        return
    for action in report.actions:
        click.echo(f"- {action}")


@click.command()
@click.option("--no-compact", is_flag=True, help="Skip compaction.")
@click.option("--no-checkpoint", is_flag=True, help="Skip writing a Delta checkpoint.")
@click.option(
    "--vacuum",
    "vacuum",
    metavar="RETENTION",
    help="Also vacuum files older than RETENTION (e.g. 168h). Refused when the rescuer still "
    "needs that history.",
)
@click.option(
    "--no-trim-log",
    is_flag=True,
    help="Skip trimming the Delta log (commit files older than log_retention, never past the "
    "oldest rescuer checkpoint).",
)
@click.option("--dry-run", is_flag=True, help="Report what vacuum and the log trim would delete.")
@json_option
@pass_cli
def maintain(
    cli: CliContext,
    no_compact: bool,
    no_checkpoint: bool,
    vacuum: str | None,
    no_trim_log: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Compact small files, write a checkpoint, trim the Delta log and (optionally) vacuum,
    never deleting history the rescuer still needs."""
    from outbox.delta.store import DeltaDocumentStore
    from outbox.maintenance import maintain as run

    settings = cli.settings()
    retention = parse_duration(vacuum, name="--vacuum") if vacuum else None
    if retention is not None and retention <= 0:
        raise ValidationError("--vacuum: retention must be positive, e.g. 168h")
    store = DeltaDocumentStore(settings.table_uri, storage_options=settings.storage_options)
    report = run(
        store,
        clock=SystemClock(),
        sql_url=settings.sql_url,
        rescue_delay_seconds=settings.rescue_delay,
        do_compact=not no_compact,
        do_checkpoint=not no_checkpoint,
        vacuum_retention_seconds=retention,
        dry_run=dry_run,
        log_retention_seconds=None if no_trim_log else settings.log_retention,
        storage_options=settings.storage_options,
    )
    result = report.to_dict()
    result["expired_duplicate_ids_deleted"] = _forget_duplicates(settings)
    if as_json:
        emit_json(result)
    else:
        print_kv("maintenance", result.items())


def _forget_duplicates(settings: Settings) -> int | None:
    """Prune the queue's expired duplicate-detection ids (None: no queue database to prune)."""
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.errors import QueueError

    try:
        with SqlQueue.from_settings(settings) as queue:
            return queue.forget_expired_duplicates(limit=None)
    except QueueError:
        return None


def register(group: click.Group) -> None:
    group.add_command(migrate)
    group.add_command(maintain)

"""``outbox migrate``: create or upgrade the Delta table and the SQL schema (and the Cosmos DB
containers and Service Bus entities when the settings use them)."""

from __future__ import annotations

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo, echo_err, emit_json
from outbox.app.cli.support import CliContext, json_option, pass_cli


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
    """Create or upgrade the Delta table and the SQL schema. Safe to run twice.

    With Service Bus configured it also creates the command queue and the destinations listed in
    servicebus_destinations. An existing entity that conflicts with the settings is reported
    (exit 1) and never changed."""
    from outbox.wiring import Backends

    settings = cli.settings(sql_url=sql_url, table_uri=table_uri, buckets=buckets)
    with Backends(settings) as backends:
        report = backends.migrate(raise_on_conflict=False)
    if as_json:
        emit_json(report.to_dict())
    elif not report.actions and not report.conflicts:
        echo(f"already up to date: {settings.table_uri} and {report.to_dict()['sql_url']}")
    else:
        for action in report.actions:
            echo(f"- {action}")
        for conflict in report.conflicts:
            echo_err(f"error: {conflict}")
    if report.conflicts:
        raise SystemExit(exit_codes.ERROR)


def register(group: click.Group) -> None:
    group.add_command(migrate)

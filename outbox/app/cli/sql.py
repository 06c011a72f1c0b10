"""``outbox sql``: the query of the current documents, for an engine the library does not run.

The text is ``outbox.delta.current.current_sql``, the one the library's own reads run, over the
source each engine reads the Delta table by (docs/readers.md): Spark and Databricks SQL
``delta.`<uri>``` (or a catalog table's name), DuckDB's ``delta_scan('<uri>')``, and for polars
the name a ``polars.SQLContext`` registers ``polars.scan_delta(uri)`` under.
"""

from __future__ import annotations

import click

from outbox.app.cli.output import echo, emit_json
from outbox.app.cli.support import CliContext, json_option, not_empty, pass_cli

DIALECTS = ("spark", "databricks", "polars", "duckdb")
#: The name the polars example registers the table's rows under (docs/readers.md).
POLARS_SOURCE = "documents"


def default_source(dialect: str, uri: str) -> str:
    """How ``dialect`` names the Delta table at ``uri`` in a query."""
    if dialect == "duckdb":
        return "delta_scan('" + uri.replace("'", "''") + "')"
    if dialect == "polars":
        return POLARS_SOURCE
    return "delta.`" + uri.replace("`", "``") + "`"


@click.command("sql")
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default="spark",
    show_default=True,
    help="The engine the query is for.",
)
@click.option(
    "--source",
    metavar="NAME",
    callback=not_empty,
    help="What the query reads, instead of the table's location (a catalog table, a view).",
)
@json_option
@pass_cli
def sql(cli: CliContext, *, dialect: str, source: str | None, as_json: bool) -> None:
    """Print the SQL of the current documents (one row per document), as the library reads them.

    Wrap it in CREATE VIEW for a view in a catalog: the same rule as Outbox.documents and
    SparkOutbox.register_view (docs/readers.md)."""
    import pyarrow as pa

    from outbox.delta.current import current_sql
    from outbox.delta.schema import has_deleted
    from outbox.delta.table import open_table

    settings = cli.settings()
    uri = settings.table_uri
    schema = pa.schema(open_table(uri, settings.storage_options).schema().to_arrow())
    tombstones = has_deleted(schema)
    chosen = source or default_source(dialect, uri)
    text = current_sql(chosen, has_deleted=tombstones)
    if as_json:
        emit_json({"dialect": dialect, "source": chosen, "has_deleted": tombstones, "sql": text})
    else:
        echo(text)


def register(group: click.Group) -> None:
    group.add_command(sql)

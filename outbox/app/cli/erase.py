"""``outbox erase``: remove documents for good (the table, its history once trimmed, the queue
database); ``--status`` lists the erasures and what each waits for (docs/erasure.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from outbox.app.cli import exit_codes
from outbox.app.cli.output import echo_err, emit_json, print_kv, print_table
from outbox.app.cli.support import CliContext, json_option, pass_cli
from outbox.core.clock import SystemClock

if TYPE_CHECKING:
    from outbox.core.model import DocumentRow
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore


@click.command()
@click.option("--id", "ids", multiple=True, metavar="ID", help="A document to erase (repeatable).")
@click.option(
    "--where",
    metavar="SQL",
    help="Erase the current documents matching this SQL condition, e.g. \"type = 'user'\".",
)
@click.option(
    "--pending",
    type=click.Choice(["send", "drop"]),
    default="send",
    show_default=True,
    help="Messages not sent yet: send them first (each document is deleted, its tombstone's "
    "messages sent, then erased; documents that still have some are left for the next run, "
    "exit 3), or drop them.",
)
@click.option("--dry-run", is_flag=True, help="Change nothing: list the documents and pending.")
@click.option("--status", "show_status", is_flag=True, help="List the erasures of this table.")
@json_option
@pass_cli
def erase(
    cli: CliContext,
    *,
    ids: tuple[str, ...],
    where: str | None,
    pending: str,
    dry_run: bool,
    show_status: bool,
    as_json: bool,
) -> None:
    """Erase documents: every row of them from the table now, their queue rows and dead letters
    now, and every older file holding them once `outbox maintain` has trimmed the log past the
    erase (after log_retention)."""
    chosen = sum(1 for given in (bool(ids), where is not None, show_status) if given)
    if chosen != 1:
        raise click.UsageError(
            "name the documents with --id ID (repeatable) or --where SQL, or give --status; "
            "exactly one of them"
        )
    from outbox.app import erasure
    from outbox.wiring.backends import open_document_store

    settings = cli.settings()
    store = open_document_store(settings)
    if show_status:
        _show_status(erasure.status(store, settings.sql_url), as_json)
        return
    clock = SystemClock()
    selected = erasure.select_ids(store, ids=ids, where=where, sql_url=settings.sql_url)
    report = erasure.erase(
        store,
        sql_url=settings.sql_url,
        ids=selected,
        clock=clock,
        pending=pending,
        send=lambda rows: _send(settings, store, rows),
        settings=settings,
        dry_run=dry_run,
    )
    result = report.to_dict()
    if as_json:
        emit_json(result)
    else:
        print_kv("erase", result.items())
    if report.still_pending and not dry_run:
        echo_err(f"{len(report.still_pending)} documents still have pending messages; run again")
        raise SystemExit(exit_codes.PENDING_TOO_OLD)


def _send(settings: Settings, store: DeltaDocumentStore, rows: Sequence[DocumentRow]) -> None:
    """The dispatcher's own dispatch of ``rows`` (the command worker's), its marks written at
    once so the erase reads them."""
    from dispatcher.runtime import DispatcherRuntime
    from outbox.wiring import Backends

    clock = SystemClock()
    with Backends(settings, clock=clock) as backends:
        runtime = DispatcherRuntime(store, settings, backends, clock=clock, watermark_window=0)
        try:
            runtime.dispatcher.dispatch(rows)
        finally:
            runtime.close()


def _show_status(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        emit_json({"erasures": rows})
        return
    columns = ("doc_id", "phase", "erased_version", "requested_at", "finished_at", "waiting_for")
    print_table("erasures", columns, [[r.get(c) for c in columns] for r in rows])


def register(group: click.Group) -> None:
    group.add_command(erase)

"""``outbox trace ID``: what happened to a document (``outbox.app.trace``), read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from outbox.app.cli.output import echo_err, emit_json, print_kv, print_table
from outbox.app.cli.support import CliContext, json_option, pass_cli
from outbox.core.clock import SystemClock
from outbox.core.durations import format_duration

if TYPE_CHECKING:  # the trace reads Delta and SQL: import it when the command runs
    from outbox.app.trace import DocumentTrace, MessageFate


@click.command("trace")
@click.argument("query", metavar="ID")
@click.option(
    "--since",
    type=click.IntRange(0),
    metavar="VERSION",
    help="First table version to read (default: the oldest commit the log keeps).",
)
@click.option(
    "--no-index",
    "no_index",
    is_flag=True,
    help="Read the change data feed over the whole history instead of the commit index "
    "(slower: a cross-check of the index).",
)
@json_option
@pass_cli
def trace_cmd(
    cli: CliContext, *, query: str, since: int | None, no_index: bool, as_json: bool
) -> None:
    """What happened to a document, found by its id, a message id or a correlation id: its
    versions from the table's history (who wrote each, which messages it added), each message's
    fate (pending with its age, accepted, waiting in a queue, dead-lettered) and the
    ProcessDocument commands that name it. Read-only."""
    from outbox.app.trace import trace

    result = trace(cli.settings(), SystemClock(), query, since=since, use_index=not no_index)
    if as_json:
        emit_json(result.to_dict())
        return
    for doc in result.documents:
        _print_document(doc, result.matched_by, result.table_version)


def _print_document(doc: DocumentTrace, matched_by: str, table_version: int) -> None:
    print_kv(
        f"document {doc.id}",
        [
            ("found by", matched_by.replace("_", " ")),
            ("type", doc.type),
            ("version", doc.version),
            ("deleted", doc.deleted),
            ("incarnation", doc.incarnation or "-"),
            ("last_seq", doc.last_seq),
            ("dispatched_seq", doc.dispatched_seq),
            ("history read", f"table versions {doc.history_from}..{table_version}"),
        ],
    )
    print_table(
        "versions (the table's history)",
        [
            "table version",
            "committed at",
            "writer",
            "operation",
            "change",
            "doc version",
            "last_seq",
            "dispatched_seq",
            "added",
        ],
        [
            (
                c.table_version,
                c.committed_at,
                c.writer,
                c.operation,
                c.change,
                "mark" if c.document_version == 0 else c.document_version,
                c.last_seq,
                c.dispatched_seq,
                c.added,
            )
            for c in doc.commits
        ]
        or [("(none in the retained history)", "", "", "", "", "", "", "", "")],
    )
    print_table(
        "messages",
        ["seq", "message id", "type", "destination", "fate", "detail"],
        [(m.seq, m.message_id, m.type, m.destination, m.fate, _detail(m)) for m in doc.messages]
        or [("(none)", "", "", "", "", "")],
    )
    if doc.commands:
        print_table(
            "ProcessDocument commands",
            ["command id", "up to seq", "state", "deliveries", "at", "dead letter", "reason"],
            [
                (
                    c.command_id,
                    c.up_to_seq,
                    c.state,
                    c.delivery_count,
                    c.at,
                    c.dead_letter_id,
                    c.reason,
                )
                for c in doc.commands
            ],
        )
    if doc.rescues:
        print_table(
            "rescue passes that commanded it",
            ["at", "rescuer", "engine", "mode", "read to version", "up to seq", "command id"],
            [
                (r.at, r.rescuer, r.engine, r.mode, r.window_end, r.up_to_seq, r.command_id)
                for r in doc.rescues
            ],
        )
    for note in doc.notes:
        echo_err(f"note: {note}")


def _detail(m: MessageFate) -> str:
    """The one line a person needs about a fate."""
    if m.queued is not None:
        q = m.queued
        if q.state == "locked" and q.locked_until is not None:
            return f"in {q.queue}, locked until {q.locked_until.isoformat(timespec='seconds')}"
        if q.state == "scheduled":
            return f"in {q.queue}, due {q.not_before.isoformat(timespec='seconds')}"
        return f"in {q.queue} (#{q.sequence_number}, {q.delivery_count} deliveries)"
    if m.dead_letter is not None:
        d = m.dead_letter
        return f"dead letter {d.id}: {d.reason} after {d.delivery_count} deliveries"
    if m.pending:
        return "waiting " + ("" if m.pending_age_s is None else format_duration(m.pending_age_s))
    return "accepted by the transport"


def register(group: click.Group) -> None:
    group.add_command(trace_cmd)

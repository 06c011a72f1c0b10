"""``outbox queue ...`` and ``outbox dead-letters ...``: look at the SQL queue and repair it.

Every command opens the queue from the settings' ``sql_url``; a missing or un-migrated database
is one line telling the user to run ``outbox migrate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from outbox.cli.support import (
    CliContext,
    emit_json,
    json_option,
    pass_cli,
    print_kv,
    print_table,
    progress,
)
from outbox.core.errors import ValidationError

if TYPE_CHECKING:  # the queue pulls in SQLAlchemy: import it when a command runs, not for --help
    from dispatcher.queue.messages import DeadLetter
    from dispatcher.queue.sql_queue import SqlQueue

_BODY_PREVIEW = 60


@contextmanager
def _open(cli: CliContext) -> Iterator[SqlQueue]:
    from dispatcher.queue.sql_queue import SqlQueue

    queue = SqlQueue.from_settings(cli.settings())
    try:
        yield queue
    finally:
        queue.close()


def _preview(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    return text if len(text) <= _BODY_PREVIEW else text[: _BODY_PREVIEW - 1] + "…"


def _dead_letter_dict(d: DeadLetter) -> dict[str, Any]:
    return {
        "id": d.id,
        "queue": d.queue,
        "message_id": d.message_id,
        "session_id": d.session_id,
        "subject": d.subject,
        "content_type": d.content_type,
        "correlation_id": d.correlation_id,
        "headers": d.headers,
        "enqueued_at": d.enqueued_at,
        "sequence_number": d.sequence_number,
        "delivery_count": d.delivery_count,
        "reason": d.reason,
        "description": d.description,
        "dead_lettered_at": d.dead_lettered_at,
        "body": d.body,
    }


def _where(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationError(
                f"--where {pair!r} is not KEY=VALUE", hint="e.g. --where reason=Timeout"
            )
        out[key.strip()] = value
    return out


def register(group: click.Group) -> None:
    """Add the ``queue`` and ``dead-letters`` command groups to ``group``."""
    group.add_command(queue_group)
    group.add_command(dead_letters_group)


@click.group("queue")
def queue_group() -> None:
    """Inspect the durable SQL queue."""


@queue_group.command("stats")
@json_option
@pass_cli
def stats_cmd(cli: CliContext, as_json: bool) -> None:
    """Depth per queue: active, scheduled, locked, dead-lettered."""
    with _open(cli) as queue:
        stats = queue.stats()
    if as_json:
        emit_json(
            {
                name: {
                    "active": s.active,
                    "scheduled": s.scheduled,
                    "locked": s.locked,
                    "dead_lettered": s.dead_lettered,
                }
                for name, s in stats.items()
            }
        )
        return
    print_table(
        "queues",
        ["queue", "active", "scheduled", "locked", "dead-lettered"],
        [(s.queue, s.active, s.scheduled, s.locked, s.dead_lettered) for s in stats.values()],
    )


@queue_group.command("peek")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(min=1))
@json_option
@pass_cli
def peek_cmd(cli: CliContext, queue_name: str, limit: int, as_json: bool) -> None:
    """Show messages in delivery order without locking or removing them."""
    with _open(cli) as queue:
        messages = queue.peek(queue_name, limit)
    if as_json:
        emit_json(
            [
                {
                    "sequence_number": m.sequence_number,
                    "message_id": m.message_id,
                    "session_id": m.session_id,
                    "state": m.state,
                    "delivery_count": m.delivery_count,
                    "enqueued_at": m.enqueued_at,
                    "not_before": m.not_before,
                    "locked_until": m.locked_until,
                    "subject": m.subject,
                    "content_type": m.content_type,
                    "body": m.body,
                }
                for m in messages
            ]
        )
        return
    print_table(
        f"{queue_name}: first {limit}",
        ["seq", "message_id", "session", "state", "deliveries", "subject", "body"],
        [
            (
                m.sequence_number,
                m.message_id,
                m.session_id,
                m.state,
                m.delivery_count,
                m.subject,
                _preview(m.body),
            )
            for m in messages
        ],
    )


@click.group("dead-letters")
def dead_letters_group() -> None:
    """List, show, requeue and purge dead-lettered messages."""


@dead_letters_group.command("list")
@click.option("--queue", "queue_name", help="Only this queue.")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@click.option("--limit", "-n", default=50, show_default=True, type=click.IntRange(min=1))
@json_option
@pass_cli
def list_cmd(
    cli: CliContext, queue_name: str | None, where: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Dead letters, oldest first."""
    with _open(cli) as queue:
        items = queue.list_dead_letters(queue_name, limit, where=_where(where))
    if as_json:
        emit_json([_dead_letter_dict(d) for d in items])
        return
    print_table(
        "dead letters",
        ["id", "queue", "message_id", "session", "reason", "deliveries", "dead-lettered at"],
        [
            (
                d.id,
                d.queue,
                d.message_id,
                d.session_id,
                d.reason,
                d.delivery_count,
                d.dead_lettered_at.isoformat(),
            )
            for d in items
        ],
    )


@dead_letters_group.command("show")
@click.argument("dead_letter_id", type=int)
@json_option
@pass_cli
def show_cmd(cli: CliContext, dead_letter_id: int, as_json: bool) -> None:
    """One dead letter in full, body included."""
    with _open(cli) as queue:
        d = queue.get_dead_letter(dead_letter_id)
    data = _dead_letter_dict(d)
    if as_json:
        emit_json(data)
        return
    print_kv(f"dead letter {d.id}", [(k, v) for k, v in data.items()])


def _bulk(
    cli: CliContext,
    verb: str,
    *,
    ids: tuple[int, ...],
    everything: bool,
    where: tuple[str, ...],
    as_json: bool,
) -> None:
    selection: dict[str, Any] = {
        "ids": list(ids) if ids else None,
        "where": _where(where) or None,
        "all": everything,
    }
    with _open(cli) as queue:
        for dead_letter_id in ids:  # an unknown id is a typo: say so instead of "0 requeued"
            queue.get_dead_letter(dead_letter_id)
        total = queue.count_dead_letters(**selection)
        action = queue.requeue if verb == "requeue" else queue.purge
        with progress(f"{verb} dead letters", total) as advance:
            done = action(**selection, on_progress=advance)
    if as_json:
        emit_json({verb + "d": done})
    else:
        click.echo(f"{verb}d {done} dead letter(s)")


_SELECTION_HELP = "Give IDs, --all, or --where KEY=VALUE (keys: queue, reason, session_id, ...)."


@dead_letters_group.command("requeue")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead letter.")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@json_option
@pass_cli
def requeue_cmd(
    cli: CliContext, ids: tuple[int, ...], everything: bool, where: tuple[str, ...], as_json: bool
) -> None:
    """Put dead letters back on their queue (same message_id, delivery count 0)."""
    _bulk(cli, "requeue", ids=ids, everything=everything, where=where, as_json=as_json)


@dead_letters_group.command("purge")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead letter.")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@json_option
@pass_cli
def purge_cmd(
    cli: CliContext, ids: tuple[int, ...], everything: bool, where: tuple[str, ...], as_json: bool
) -> None:
    """Delete dead letters for good."""
    _bulk(cli, "purge", ids=ids, everything=everything, where=where, as_json=as_json)


requeue_cmd.help = f"{requeue_cmd.help} {_SELECTION_HELP}"
purge_cmd.help = f"{purge_cmd.help} {_SELECTION_HELP}"

"""``outbox queue stats`` and ``outbox queue peek``: look into the durable SQL queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from outbox.app.cli.output import emit_json, print_table
from outbox.app.cli.support import CliContext, json_option, limit_option, open_queue, pass_cli
from outbox.core.errors import ValidationError
from outbox.core.settings import TOPIC_PREFIX, Settings, did_you_mean

if TYPE_CHECKING:
    from dispatcher.queue.sql_queue import SqlQueue

_BODY_PREVIEW = 60
#: Known queue names an "unknown queue" error lists (``outbox queue stats`` shows them all).
_LISTED = 10


def _preview(body: bytes) -> str:
    """A message body cut to one table cell; an empty body (a signal) says so."""
    if not body:
        return "(empty)"
    text = body.decode("utf-8", "replace")
    return text if len(text) <= _BODY_PREVIEW else text[: _BODY_PREVIEW - 1] + "…"


@click.group("queue")
def queue_group() -> None:
    """Inspect the durable SQL queue."""


@queue_group.command("stats")
@json_option
@pass_cli
def stats_cmd(cli: CliContext, as_json: bool) -> None:
    """Depth per queue: active, scheduled, locked, deferred, dead-lettered."""
    with open_queue(cli) as queue:
        stats = queue.stats()
    if as_json:  # the shape of `status --json`'s "queues": a list of QueueDepth objects
        from dataclasses import asdict

        from outbox.app.status import QueueDepth

        emit_json([asdict(QueueDepth.of(s)) for s in stats.values()])
        return
    print_table(
        "queues",
        ["queue", "active", "scheduled", "locked", "deferred", "dead-lettered"],
        [
            (s.queue, s.active, s.scheduled, s.locked, s.deferred, s.dead_lettered)
            for s in stats.values()
        ],
    )


def named_queues(settings: Settings) -> set[str]:
    """The queues the settings name: the command queue and the declared destinations."""
    named = {settings.command_queue, *settings.destinations}
    named |= {d.removeprefix(TOPIC_PREFIX) for d in settings.servicebus_destinations}
    if settings.default_destination:
        named.add(settings.default_destination)
    return named


def check_known_queue(queue: SqlQueue, name: str, settings: Settings) -> None:
    """``ValidationError`` unless ``name`` holds messages or dead letters, or a setting names it.

    The queue has no list of queues (one is there once something is sent to it), so a typo
    such as ``queue peek shipmnets`` would otherwise read as an empty queue: all clear. A queue
    that was drained and that no setting names is unknown here too; the message says why."""
    held = set(queue.stats())
    if name in held or name in named_queues(settings):
        return
    known = sorted(held | named_queues(settings))
    listed = ", ".join(known[:_LISTED]) + (", ..." if len(known) > _LISTED else "")
    raise ValidationError(
        f"queue {name!r} is unknown{did_you_mean(name, known)}: it holds no messages or dead "
        "letters, and no setting names it",
        hint=f"peek one of {listed} (`outbox queue stats` lists them)"
        if known
        else "nothing was sent to any queue yet",
    )


@queue_group.command("peek")
@click.argument("queue_name", metavar="QUEUE")
@limit_option(20)
@click.option(
    "--deferred",
    is_flag=True,
    help="Only deferred messages (received only by sequence number: receive_deferred).",
)
@json_option
@pass_cli
def peek_cmd(cli: CliContext, queue_name: str, limit: int, deferred: bool, as_json: bool) -> None:
    """Show messages in delivery order without locking or removing them."""
    with open_queue(cli) as queue:
        messages = queue.peek(queue_name, limit, deferred=deferred)
        if not messages:
            check_known_queue(queue, queue_name, cli.settings())
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
        f"{queue_name}: first {limit}{' deferred' if deferred else ''}",
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


def register(group: click.Group) -> None:
    group.add_command(queue_group)

"""``outbox dead-letters list|show|requeue|purge``: look at dead-lettered messages and repair.

With ``command_transport = "servicebus"`` they address the Service Bus command queue's dead-letter
subqueue (ids are its sequence numbers); ``outbox dead-letters --sql ...`` addresses the SQL
queue's dead letters instead (the SQL transport's messages), and ``--kafka-topic T`` a Kafka
consumer's dead-letter topic (``dispatcher.kafka.dead_letters``)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from outbox.app.cli.output import ask, echo, emit_json, print_kv, print_table, progress
from outbox.app.cli.support import CliContext, json_option, limit_option, open_queue, pass_cli
from outbox.core.errors import MessageNotFoundError, ValidationError

if TYPE_CHECKING:  # the queue pulls in SQLAlchemy: import it when a command runs, not for --help
    from dispatcher.queue.messages import DeadLetter

_SELECTION_HELP = "Give IDs, --all, or --where KEY=VALUE (keys: queue, reason, session_id, ...)."
#: The largest id any backend has: a 64-bit integer (the SQL queue's ids, Service Bus sequence
#: numbers, Kafka's partition and offset).
MAX_ID = 2**63 - 1


def _no_such_id(dead_letter_id: int) -> None:
    """An id past any id there can be is simply not there: the same line as for an id that is
    not (rather than the database driver's overflow, which reads like a bug)."""
    if dead_letter_id > MAX_ID:
        raise MessageNotFoundError(
            f"no dead letter has id {dead_letter_id}",
            hint="list them with `outbox dead-letters list`",
        )


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


@contextmanager
def _dead_letters(cli: CliContext) -> Iterator[Any]:
    """The SQL queue's dead letters, or with commands elsewhere (Service Bus), the command
    queue's, unless ``--sql`` was given."""
    from outbox.wiring import Backends

    meta = click.get_current_context().meta
    kafka_topic = meta.get("dead_letters.kafka_topic")
    if kafka_topic:
        from dispatcher.kafka.config import KafkaConfig
        from dispatcher.kafka.dead_letters import KafkaDeadLetters

        yield KafkaDeadLetters(KafkaConfig.from_settings(cli.settings()), kafka_topic)
        return
    use_sql = bool(meta.get("dead_letters.sql"))
    if use_sql:
        with open_queue(cli) as queue:
            yield queue
        return
    with Backends(cli.settings()) as backends:
        yield backends.command_queue()


@click.group("dead-letters")
@click.option(
    "--sql",
    "use_sql",
    is_flag=True,
    help="The SQL queue's dead letters even when commands go to Service Bus.",
)
@click.option(
    "--kafka-topic",
    "kafka_topic",
    metavar="TOPIC",
    help="A Kafka consumer's dead-letter topic (e.g. orders.dlt) instead of a queue's dead "
    "letters: list, show and requeue (to the topic each came from); Kafka cannot purge.",
)
@click.pass_context
def dead_letters_group(ctx: click.Context, *, use_sql: bool, kafka_topic: str | None) -> None:
    """List, show, requeue and purge dead-lettered messages."""
    ctx.meta["dead_letters.sql"] = use_sql
    ctx.meta["dead_letters.kafka_topic"] = kafka_topic


@dead_letters_group.command("list")
@click.option("--queue", "queue_name", help="Only this queue.")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@limit_option(50)
@json_option
@pass_cli
def list_cmd(
    cli: CliContext, *, queue_name: str | None, where: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Dead letters, oldest first."""
    with _dead_letters(cli) as queue:
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
def show_cmd(cli: CliContext, *, dead_letter_id: int, as_json: bool) -> None:
    """One dead letter in full, body included."""
    _no_such_id(dead_letter_id)
    with _dead_letters(cli) as queue:
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
    yes: bool = False,
    to_queue: str | None = None,
    rate: float | None = None,
) -> None:
    if sum([bool(ids), bool(where), everything]) != 1:
        raise ValidationError(
            f"say which dead letters to {verb}: ids, --where KEY=VALUE, or --all (exactly one)",
            hint=f"e.g. outbox dead-letters {verb} 12 13, {verb} --where reason=Timeout, or "
            f"{verb} --all" + (" --yes" if verb == "purge" else ""),
        )
    for dead_letter_id in ids:
        _no_such_id(dead_letter_id)
    selection: dict[str, Any] = {
        "ids": list(ids) if ids else None,
        "where": _where(where) or None,
        "all": everything,
    }
    from outbox.app.operators import record_cli

    with _dead_letters(cli) as queue:
        for dead_letter_id in ids:  # an unknown id is a typo: say so instead of "0 requeued"
            queue.get_dead_letter(dead_letter_id)
        total = queue.count_dead_letters(**selection)
        if verb == "purge" and everything and not yes and total:
            _confirm_purge_all(total)
        action = queue.requeue if verb == "requeue" else queue.purge
        extra: dict[str, Any] = {}
        if to_queue is not None or rate is not None:
            if "to_queue" not in inspect.signature(queue.requeue).parameters:  # SQL's only
                raise ValidationError(
                    "--to and --rate work on the SQL queue's dead letters",
                    hint="add --sql, or leave them out for this backend's dead letters",
                )
            extra["to_queue"] = to_queue
        pacer = None
        if rate is not None:
            from outbox.core.clock import SystemClock
            from outbox.core.pacing import Pacer

            pacer = Pacer(rate, SystemClock())
            extra["chunk"] = pacer.chunk()
        with progress(f"{verb} dead letters", total) as advance:

            def step(n: int) -> None:
                advance(n)
                if pacer is not None:
                    pacer.step(n)

            done = action(**selection, on_progress=step, **extra)
        into = f" into {to_queue}" if to_queue else ""
        paced = f" at {rate:g}/s" if rate else ""
        record_cli(
            queue, f"dead-letters.{verb}", _target(ids, where, everything) + into + paced,
            f"{done} {verb}d",
        )  # fmt: skip
    if as_json:
        emit_json({verb + "d": done})
    else:
        echo(f"{verb}d {done} dead letter(s)")


def _target(ids: tuple[int, ...], where: tuple[str, ...], everything: bool) -> str:
    """What a bulk action names, as the audit trail keeps it."""
    from outbox.app.operators import ids_target

    if ids:
        return ids_target("dead letters", list(ids))
    if where:
        return "every dead letter matching " + " ".join(where)
    return "every dead letter" if everything else ""


def _confirm_purge_all(total: int) -> None:
    """Deleting every dead letter cannot be undone: asked on a terminal, refused elsewhere
    without ``--yes`` (a script must say it means it)."""
    answer = ask(f"delete all {total} dead letter(s) for good?")
    if answer is None:
        raise ValidationError(
            f"purge --all would delete {total} dead letter(s) for good and stdin is not a "
            "terminal to confirm it; nothing was deleted",
            hint="add --yes to confirm",
        )
    if not answer:
        raise ValidationError("purge --all not confirmed; nothing was deleted")


@dead_letters_group.command("requeue")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead letter.")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@click.option(
    "--to",
    "to_queue",
    metavar="QUEUE",
    help="Into this queue instead of each one's own (the SQL queue's dead letters).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    metavar="PER_SECOND",
    help="At most this many a second, so a recovering consumer is not swamped.",
)
@json_option
@pass_cli
def requeue_cmd(
    cli: CliContext,
    *,
    ids: tuple[int, ...],
    everything: bool,
    where: tuple[str, ...],
    to_queue: str | None,
    rate: float | None,
    as_json: bool,
) -> None:
    """Put dead letters back on their queue (same message_id, delivery count 0)."""
    _bulk(
        cli, "requeue", ids=ids, everything=everything, where=where, as_json=as_json,
        to_queue=to_queue, rate=rate,
    )  # fmt: skip


@dead_letters_group.command("purge")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "everything", is_flag=True, help="Every dead letter (asks first).")
@click.option("--where", "where", multiple=True, metavar="KEY=VALUE", help="Filter (repeatable).")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask before --all (required for --all when stdin is not a terminal).",
)
@json_option
@pass_cli
def purge_cmd(
    cli: CliContext,
    *,
    ids: tuple[int, ...],
    everything: bool,
    where: tuple[str, ...],
    yes: bool,
    as_json: bool,
) -> None:
    """Delete dead letters for good."""
    _bulk(cli, "purge", ids=ids, everything=everything, where=where, as_json=as_json, yes=yes)


requeue_cmd.help = f"{requeue_cmd.help} {_SELECTION_HELP}"
purge_cmd.help = f"{purge_cmd.help} {_SELECTION_HELP}"


def register(group: click.Group) -> None:
    group.add_command(dead_letters_group)

"""``outbox keys list`` and ``outbox keys resume``: the ordering keys a failed send paused.

A key is paused when a document stopped with an unsent message of it; later messages of the key,
from any document and any process, wait behind that message (the gate) and leave in the order
they were committed once it is delivered (docs/dispatcher.md, "Order per ordering key"). A gate
whose command was dead-lettered holds its key until an operator acts: requeue the command, or give
up on the gate here.
"""

from __future__ import annotations

import click

from outbox.app.cli.output import echo, emit_json
from outbox.app.cli.support import CliContext, json_option, limit_option, open_queue, pass_cli
from outbox.core.errors import ValidationError


@click.group("keys")
def keys_group() -> None:
    """Paused ordering keys: list them, resume one."""


@keys_group.command("list")
@limit_option(100, "Keys to list, the longest paused first.")
@json_option
@pass_cli
def list_cmd(cli: CliContext, *, limit: int, as_json: bool) -> None:
    """Each paused key: the message it waits for, since when, why, and how many wait behind it."""
    from dataclasses import asdict

    from outbox.app.cli.status import print_paused_keys
    from outbox.app.keys import paused_keys
    from outbox.core.clock import SystemClock, utc

    with open_queue(cli) as queue:
        keys = paused_keys(queue, utc(SystemClock().now()), limit)
    if as_json:  # the shape of `status --json`'s "paused_keys"
        emit_json([asdict(k) for k in keys])
        return
    if not keys:
        echo("no paused ordering keys")
        return
    print_paused_keys("paused ordering keys", keys)


@keys_group.command("resume")
@click.argument("destination")
@click.argument("key")
@click.option(
    "--skip",
    "message_id",
    metavar="MESSAGE_ID",
    help="Give up on the gate when it is this message: the next held document goes next, in "
    "order. A repeat does nothing.",
)
@click.option(
    "--open",
    "open_key",
    is_flag=True,
    help="Open the key: every held document goes when its retry comes, in no set order.",
)
@json_option
@pass_cli
def resume_cmd(
    cli: CliContext,
    *,
    destination: str,
    key: str,
    message_id: str | None,
    open_key: bool,
    as_json: bool,
) -> None:
    """Resume a paused ordering key: skip its gate message (--skip), or open it (--open)."""
    from dispatcher.keys import KeyOrder
    from dispatcher.queue.key_lines import SqlKeyLines
    from outbox.app.operators import record_cli

    if (message_id is None) == (not open_key):
        raise ValidationError(
            "say how to resume the key: --skip MESSAGE_ID (the gate `outbox keys list` shows) "
            "or --open",
            hint=f"e.g. outbox keys resume {destination} {key} --skip <message id>",
        )
    with open_queue(cli) as queue:
        lines = SqlKeyLines(queue.database)
        done = KeyOrder(lines).resume((destination, key), None if open_key else message_id)
        record_cli(
            queue,
            "keys.open" if open_key else "keys.skip",
            f"{destination}/{key}" + ("" if open_key else f", gate {message_id}"),
            ("opened" if open_key else "skipped the gate") if done else "nothing to do",
        )
    if as_json:
        emit_json({"destination": destination, "ordering_key": key, "resumed": done})
    elif done:
        echo(
            f"{destination}/{key}: opened"
            if open_key
            else f"{destination}/{key}: gave up on {message_id}; the next held document goes next"
        )
    else:
        echo(
            f"{destination}/{key}: nothing to do (it is not paused"
            + ("" if open_key else f", or its gate is no longer {message_id}")
            + ")"
        )


def register(group: click.Group) -> None:
    group.add_command(keys_group)

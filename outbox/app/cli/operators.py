"""``outbox operators create|list|revoke`` and ``outbox audit``: the console's named operators
and the audit trail of actions on the queue's contents (``outbox.app.operators``)."""

from __future__ import annotations

import click

from outbox.app.cli.output import echo, echo_err, emit_json, print_table
from outbox.app.cli.support import CliContext, json_option, limit_option, open_queue, pass_cli


@click.group("operators")
def operators_group() -> None:
    """Named console tokens: create one per person, list them, revoke one."""


@operators_group.command("create")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["operator", "read-only"]),
    default="operator",
    show_default=True,
    help="operator: may requeue, purge and resume keys in the console; read-only: may not.",
)
@json_option
@pass_cli
def create_cmd(cli: CliContext, *, name: str, role: str, as_json: bool) -> None:
    """Make NAME's console token and print it once (only its SHA-256 is kept)."""
    from outbox.app.operators import Audit, Operators, cli_actor
    from outbox.core.clock import SystemClock

    clock = SystemClock()
    with open_queue(cli) as queue:
        token = Operators(queue.database, clock).create(name, role)
        Audit(queue.database, clock).record(
            cli_actor(), "operators.create", name, f"created ({role})"
        )
    if as_json:
        emit_json({"name": name, "role": role, "token": token})
        return
    echo(token)
    echo_err(f"operator {name} ({role}): the token above unlocks `outbox console` as {name}; it "
             "is not shown again")  # fmt: skip


@operators_group.command("list")
@json_option
@pass_cli
def list_cmd(cli: CliContext, *, as_json: bool) -> None:
    """Every named operator: role, when made, when revoked."""
    from outbox.app.operators import Operators
    from outbox.core.clock import SystemClock

    with open_queue(cli) as queue:
        found = Operators(queue.database, SystemClock()).list()
    if as_json:
        emit_json(
            [
                {
                    "name": o.name,
                    "role": o.role,
                    "created_at": o.created_at.isoformat(),
                    "revoked_at": None if o.revoked_at is None else o.revoked_at.isoformat(),
                }
                for o in found
            ]
        )
        return
    if not found:
        echo("no named operators (the console's own token still works)")
        return
    print_table(
        "operators",
        ["name", "role", "created", "revoked"],
        [(o.name, o.role, o.created_at, o.revoked_at or "-") for o in found],
    )


@operators_group.command("revoke")
@click.argument("name")
@json_option
@pass_cli
def revoke_cmd(cli: CliContext, *, name: str, as_json: bool) -> None:
    """Revoke NAME's token: its console sessions end at their next request."""
    from outbox.app.operators import Audit, Operators, cli_actor
    from outbox.core.clock import SystemClock
    from outbox.core.errors import ValidationError

    clock = SystemClock()
    with open_queue(cli) as queue:
        done = Operators(queue.database, clock).revoke(name)
        Audit(queue.database, clock).record(
            cli_actor(), "operators.revoke", name, "revoked" if done else "no such active operator"
        )
    if not done:
        raise ValidationError(
            f"no active operator {name!r}", hint="`outbox operators list` shows them"
        )
    if as_json:
        emit_json({"name": name, "revoked": True})
    else:
        echo(f"operator {name}: revoked; their console sessions end at their next request")


@click.command("audit")
@limit_option(50, "Entries to show, newest first.")
@json_option
@pass_cli
def audit_cmd(cli: CliContext, *, limit: int, as_json: bool) -> None:
    """The audit trail: who did what to the queue's contents, when, on which ids, with what
    outcome (through the console or the command line), newest first."""
    from outbox.app.operators import Audit
    from outbox.core.clock import SystemClock

    with open_queue(cli) as queue:
        rows = Audit(queue.database, SystemClock()).page(limit=limit)
    if as_json:
        emit_json(
            [
                {
                    "id": e.id,
                    "at": e.at.isoformat(),
                    "actor": e.actor,
                    "action": e.action,
                    "target": e.target,
                    "outcome": e.outcome,
                }
                for e in rows
            ]
        )
        return
    if not rows:
        echo("nothing recorded yet")
        return
    print_table(
        "audit trail",
        ["id", "at", "who", "action", "on", "outcome"],
        [(e.id, e.at, e.actor, e.action, e.target[:80], e.outcome) for e in rows],
    )


def register(group: click.Group) -> None:
    group.add_command(operators_group)
    group.add_command(audit_cmd)

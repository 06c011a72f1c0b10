"""``outbox devices list`` and ``outbox devices show DEVICE``: the devices a gateway serves, online
or offline and since when, and each task's tries, last try and next try, read from its queue's
database (every gateway process at once)."""

from __future__ import annotations

from datetime import datetime

import click

from outbox.app.cli.output import emit_json, print_kv, print_table
from outbox.app.cli.support import MAX_LIMIT, CliContext, json_option, open_queue, pass_cli
from outbox.core.errors import ValidationError
from outbox.core.settings import did_you_mean


def _at(when: datetime | None) -> str:
    return when.isoformat(timespec="seconds") if when is not None else "-"


_destination = click.option(
    "--destination",
    default="devices",
    show_default=True,
    envvar="OUTBOX_GATEWAY_DESTINATION",
    help="The gateway's queue (its sessions are the devices).",
)
_limit = click.option(
    "--limit",
    default=10_000,
    show_default=True,
    type=click.IntRange(1, MAX_LIMIT),
    help="Read at most this many queued tasks and this many failed ones.",
)


@click.group("devices")
def devices_group() -> None:
    """Each device's presence, the task out to it with its tries, what waits, what failed."""


@devices_group.command("list")
@_destination
@_limit
@json_option
@pass_cli
def list_cmd(cli: CliContext, destination: str, limit: int, as_json: bool) -> None:
    """One row per device with a status, tasks queued or failed."""
    from dispatcher.mqtt.devices import device_statuses

    with open_queue(cli) as queue:
        statuses = device_statuses(queue, destination, limit=limit)
    if as_json:
        emit_json([s.to_dict() for s in statuses])
        return
    print_table(
        f"devices on {destination}",
        ["device", "presence", "since", "task out", "tries", "last try", "next try", "queued",
         "failed"],
        [
            (
                s.device,
                s.presence,
                _at(s.since),
                s.in_flight or "-",
                s.tries if s.in_flight else "-",
                _at(s.last_try) if s.in_flight else "-",
                _at(s.next_try) if s.in_flight else "-",
                s.queued,
                len(s.failed),
            )
            for s in statuses
        ],
    )  # fmt: skip


@devices_group.command("show")
@click.argument("device")
@_destination
@_limit
@json_option
@pass_cli
def show_cmd(cli: CliContext, device: str, destination: str, limit: int, as_json: bool) -> None:
    """One device: its presence, each task with its tries, last try and next try, and its
    failed tasks."""
    from dispatcher.mqtt.devices import device_statuses

    with open_queue(cli) as queue:
        found = device_statuses(queue, destination, limit=limit, device=device)
        if not found:  # a typo would otherwise show an empty device: all clear
            known = [s.device for s in device_statuses(queue, destination, limit=limit)]
            raise ValidationError(
                f"device {device!r} is unknown on queue {destination!r}"
                f"{did_you_mean(device, known)}: it has no task, no failed task and no "
                "recorded presence there",
                hint=f"list the devices with `outbox devices list --destination {destination}`",
            )
    status = found[0]
    if as_json:
        emit_json(status.to_dict(details=True))
        return
    fields = status.to_dict()
    fields.pop("failed")
    print_kv(f"device {device} on {destination}", fields.items())
    print_table(
        f"tasks of {device}",
        ["message id", "state", "tries", "last try", "next try", "enqueued at"],
        [
            (t.message_id, t.state, t.tries, _at(t.last_try), _at(t.next_try), _at(t.enqueued_at))
            for t in status.tasks
        ],
    )
    print_table(
        f"failed tasks of {device}",
        ["message id", "reason", "dead-lettered at", "description"],
        [(d.message_id, d.reason, _at(d.dead_lettered_at), d.description) for d in status.failed],
    )


def register(group: click.Group) -> None:
    group.add_command(devices_group)

"""``outbox devices list`` and ``outbox devices show DEVICE``: the devices a gateway serves, read
from its queue (every gateway process at once)."""

from __future__ import annotations

import click

from outbox.app.cli.output import emit_json, print_kv, print_table
from outbox.app.cli.support import CliContext, json_option, open_queue, pass_cli

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
    type=click.IntRange(min=1),
    help="Read at most this many queued tasks and this many failed ones.",
)


@click.group("devices")
def devices_group() -> None:
    """What each device has in flight, queued and failed."""


@devices_group.command("list")
@_destination
@_limit
@json_option
@pass_cli
def list_cmd(cli: CliContext, destination: str, limit: int, as_json: bool) -> None:
    """One row per device with tasks queued or failed."""
    from dispatcher.mqtt.devices import device_statuses

    with open_queue(cli) as queue:
        statuses = device_statuses(queue.receiver, queue.admin, destination, limit=limit)
    if as_json:
        emit_json([s.to_dict() for s in statuses])
        return
    print_table(
        f"devices of {destination}",
        ["device", "in flight", "deliveries", "waiting since", "queued", "next", "failed"],
        [
            (
                s.device,
                s.in_flight or "-",
                s.deliveries if s.in_flight else "-",
                s.waiting_since.isoformat(timespec="seconds") if s.waiting_since else "-",
                s.queued,
                s.next_task or "-",
                len(s.failed),
            )
            for s in statuses
        ],
    )


@devices_group.command("show")
@click.argument("device")
@_destination
@_limit
@json_option
@pass_cli
def show_cmd(cli: CliContext, device: str, destination: str, limit: int, as_json: bool) -> None:
    """One device: its task in flight, what waits behind it, and its failed tasks."""
    from dispatcher.mqtt.devices import DeviceStatus, device_statuses

    with open_queue(cli) as queue:
        found = device_statuses(
            queue.receiver, queue.admin, destination, limit=limit, device=device
        )
    status = found[0] if found else DeviceStatus(device)
    if as_json:
        emit_json(status.to_dict(details=True))
        return
    fields = status.to_dict()
    fields.pop("failed")
    print_kv(f"device {device} on {destination}", fields.items())
    print_table(
        f"failed tasks of {device}",
        ["message id", "reason", "dead-lettered at", "description"],
        [
            (
                d.message_id,
                d.reason,
                d.dead_lettered_at.isoformat(timespec="seconds"),
                d.description,
            )
            for d in status.failed
        ],
    )


def register(group: click.Group) -> None:
    group.add_command(devices_group)

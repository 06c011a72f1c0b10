"""``outbox run-gateway mqtt``: serve devices that handle one task at a time from the SQL queue.

Every option can also come from the environment (``OUTBOX_GATEWAY_<OPTION>``, e.g.
``OUTBOX_GATEWAY_BROKER``), so a service unit keeps the password out of its command line.
"""

from __future__ import annotations

import logging

import click

from outbox.app.cli.output import emit_json, print_kv
from outbox.app.cli.support import DURATION, CliContext, json_option, pass_cli
from outbox.app.cli.telemetry_options import metrics_port_option, start_gateway_telemetry

log = logging.getLogger("outbox.gateway")


@click.group("run-gateway")
def run_gateway() -> None:
    """Long-running gateways from the queue to devices."""


@run_gateway.command("mqtt", context_settings={"auto_envvar_prefix": "OUTBOX_GATEWAY"})
@click.option("--destination", required=True, help="The queue whose sessions are devices.")
@click.option("--broker", required=True, help="mqtt://host:port, or mqtts://host:port for TLS.")
@click.option("--username", default=None, help="Broker login.")
@click.option("--password", default=None, help="Broker password (better: the environment).")
@click.option("--tls", is_flag=True, help="TLS even with an mqtt:// URL.")
@click.option("--ca-file", default=None, help="CA certificates to check the broker with.")
@click.option(
    "--topic",
    default="devices/{session}/tasks",
    show_default=True,
    help="Where a device's tasks go ({session} is the device).",
)
@click.option(
    "--ack-topic",
    default="devices/{session}/tasks/ack",
    show_default=True,
    help="Where a device acks ({session} is the device); the ack carries the message id.",
)
@click.option(
    "--status-topic",
    default="devices/{session}/status",
    show_default=True,
    help="Where each device keeps its retained online/offline status (Last Will); '' turns "
    "presence off (every device counts as online).",
)
@click.option(
    "--ack-group",
    default="outbox-gateway",
    show_default=True,
    help="Shared-subscription group for acks, so each ack reaches one gateway process; '' "
    "subscribes plainly.",
)
@click.option(
    "--retry-interval",
    type=DURATION,
    default="10s",
    show_default=True,
    help="Publish the same task again after this long without an ack (at most 5m).",
)
@click.option(
    "--max-tries",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Publishes without an ack (while the device is online) before the task is "
    "dead-lettered DeviceDidNotAck.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="Tasks this process has published and not yet seen acked or retried (one per device).",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 1000),
    default=500,
    show_default=True,
    help="Tasks one receive takes from the queue.",
)
@click.option(
    "--time-to-live",
    type=DURATION,
    default=None,
    help="Dead-letter a task this old (Expired) instead of publishing it; a message's "
    "expires_at header also counts.",
)
@click.option(
    "--poll-interval",
    type=DURATION,
    default="500ms",
    show_default=True,
    help="Wait between receives when no device has a task ready (an ack ends the wait).",
)
@click.option("--once", is_flag=True, help="Serve what is ready now, then exit.")
@metrics_port_option
@json_option
@pass_cli
def mqtt(
    cli: CliContext,
    *,
    metrics_port: int | None,
    destination: str,
    broker: str,
    username: str | None,
    password: str | None,
    tls: bool,
    ca_file: str | None,
    topic: str,
    ack_topic: str,
    status_topic: str,
    ack_group: str,
    retry_interval: float,
    max_tries: int,
    max_in_flight: int,
    batch: int,
    time_to_live: float | None,
    poll_interval: float,
    once: bool,
    as_json: bool,
) -> None:
    """Publish each device's tasks one at a time (QoS 1), complete each on the device's ack,
    publish it again after --retry-interval, dead-letter it after --max-tries; an offline
    device's tasks wait. Every task's state is in the queue's database, so a waiting device holds
    no slot. Stops cleanly on SIGTERM/SIGINT (exit 0); tasks out keep their next try."""
    from dispatcher.mqtt.client import MqttBroker
    from dispatcher.mqtt.gateway import GatewayOptions, MqttGateway
    from dispatcher.queue import validation
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.errors import ConfigurationError, ValidationError

    try:
        validation.queue_name(destination)
    except ValidationError as e:
        raise ConfigurationError(f"--destination: {e}") from e
    options = GatewayOptions(
        destination=destination,
        topic=topic,
        ack_topic=ack_topic,
        retry_interval=retry_interval,
        status_topic=status_topic or None,
        ack_group=ack_group or None,
        max_tries=max_tries,
        max_in_flight=max_in_flight,
        batch=batch,
        poll_interval=poll_interval,
        time_to_live=time_to_live,
    ).checked()
    endpoint = MqttBroker.parse(
        broker, username=username, password=password, tls=tls or None, ca_file=ca_file
    )
    queue = SqlQueue.from_settings(cli.settings(), pool_size=2)
    try:
        gateway = MqttGateway(queue, options, broker=endpoint)
        start_gateway_telemetry(metrics_port, gateway, queue)
        log.info(
            "run-gateway mqtt: queue %r -> %s %s, acks on %s, statuses on %s",
            destination,
            endpoint.url,
            topic,
            options.ack_subscription,
            options.status_topic or "(presence off)",
        )
        try:
            stats = gateway.run(once=once)
        finally:
            gateway.close()
    finally:
        queue.close()
    if as_json:
        emit_json(stats.to_dict())
    else:
        print_kv("run-gateway mqtt", stats.to_dict().items())


def register(group: click.Group) -> None:
    group.add_command(run_gateway)

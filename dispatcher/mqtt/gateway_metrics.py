"""The gateway's OpenTelemetry metrics (``outbox.gateway.*``), next to its ``GatewayStats``.

Why apart from the gateway: the gateway says what happened (``published``, ``acked``...), this
module knows the instrument names, units and attributes that docs/observability.md documents.
Every call is a no-op until an SDK is configured (``run-gateway mqtt --metrics-port``).
"""

from __future__ import annotations

from collections.abc import Callable

from outbox.core import telemetry

#: counter name -> description (Prometheus: ``outbox_gateway_<name>_total``)
COUNTERS = {
    "tasks_published": "task publishes the broker acknowledged (re-publishes included)",
    "tasks_republished": "publishes of a task again after no ack within the retry interval",
    "tasks_acked": "tasks a device acked and the gateway completed",
    "tasks_returned": "tasks given back to the line, the try not counted (device offline, "
    "broker failure)",
    "tasks_dead_lettered": "tasks dead-lettered, by reason (DeviceDidNotAck, Expired, ...)",
    "publish_failures": "publishes the broker did not take (retried; not a try)",
    "lock_lost": "tasks whose queue lock was lost before they were settled",
    "unknown_acks": "acks naming no task delivered to that device",
    "bad_messages": "messages from devices that are no ack or status (malformed, wrong topic)",
}


def count(name: str, n: int = 1, **attributes: str) -> None:
    """Add ``n`` to ``outbox.gateway.<name>`` (one of ``COUNTERS``)."""
    telemetry.instrument("counter", f"outbox.gateway.{name}", "{task}", COUNTERS[name]).add(
        n, attributes
    )


def observe_ack(seconds: float) -> None:
    """``outbox.gateway.ack.duration``: last publish -> the device's ack."""
    telemetry.instrument(
        "histogram", "outbox.gateway.ack.duration", "s", "a task's last publish to its ack"
    ).record(seconds)


def observe_in_flight(in_flight: Callable[[], int]) -> None:
    """``outbox.gateway.devices_in_flight``: devices with a task out and no ack yet. The queue
    holds back each such device's next task (one in flight per device), so a count stuck high
    means devices that stopped acking."""
    telemetry.observe(
        "outbox.gateway.devices_in_flight",
        "{device}",
        "devices with a task published and not yet acked (their next tasks wait)",
        lambda: [(float(in_flight()), {})],
    )

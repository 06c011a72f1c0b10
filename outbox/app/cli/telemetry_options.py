"""``--metrics-port`` for the long-running commands, and starting the OpenTelemetry SDK for them.

Why a module of its own: ``run-dispatcher`` and ``rescue --every`` share the option and the
start-up, and their modules are edited for other reasons; each needs one decorator and one call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from outbox.core.clock import utc

if TYPE_CHECKING:
    from dispatcher.mqtt.gateway import MqttGateway
    from dispatcher.queue.command_queue import CommandQueue
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.health import Check
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore

#: the longest one poll may take before ``/healthz`` says the process is stuck (seconds): a batch
#: of commands or a rescue pass; generous, since a false "dead" restarts a working process
POLL_BUDGET = 300.0
#: a rescue pass on Spark (a JVM job on a cluster) may take far longer
SPARK_PASS_BUDGET = 1800.0
#: ``outbox.queue.messages`` states of the SQL queue (``QueueStats`` fields)
QUEUE_STATES = ("active", "scheduled", "locked", "deferred", "dead_lettered")

F = TypeVar("F", bound=Callable[..., Any])


def metrics_port_option(f: F) -> F:
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        default=None,
        metavar="PORT",
        help="Serve Prometheus metrics on http://0.0.0.0:PORT/metrics, and /healthz (liveness) "
        "and /readyz (store and queue reachable) for probes (needs the otel extra). Traces and "
        "metrics also go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.",
    )(f)


def start_telemetry(
    metrics_port: int | None,
    *,
    service_name: str,
    queue: CommandQueue | None = None,
    queue_name: str | None = None,
    settings: Settings | None = None,
    checks: Sequence[Check] = (),
    poll_budget: float = POLL_BUDGET,
) -> None:
    """Install the SDK (when asked for by the option or the OTLP variables) and, on the metrics
    port, ``/healthz`` and ``/readyz`` (``outbox.core.health``). With ``queue``: its depth per
    queue and state as ``outbox.queue.messages`` (a Service Bus queue: its runtime properties),
    and readiness asks it for ``queue_name``'s depth. With ``settings``: the table's pending
    messages and the oldest one's age (read at each scrape, like ``outbox status``), and
    readiness reads the table's version."""
    from outbox.core import telemetry  # the OpenTelemetry API: loaded when a command runs
    from outbox.core.health import Health

    parts: list[Check] = []
    if settings is not None:
        parts.append(("store", StoreProbe(settings).check))
    if queue is not None:
        parts.append(("queue", lambda: queue.stats(queue_name)))
    health = Health([*parts, *checks], poll_budget=poll_budget)
    telemetry.configure(metrics_port=metrics_port, service_name=service_name, health=health)
    if queue is not None:
        telemetry.observe_queue_depth(queue_depths(queue))
    if settings is not None and metrics_port is not None:
        probe = PendingProbe(settings)
        telemetry.observe(
            "outbox.pending.messages",
            "{message}",
            "messages committed and not yet sent",
            lambda: [(probe.read(fresh=True)[0], {})],
        )
        telemetry.observe(
            "outbox.pending.oldest_age",
            "s",
            "age of the oldest pending message (0 when none)",
            lambda: [(probe.read(fresh=False)[1], {})],
        )


def start_gateway_telemetry(
    metrics_port: int | None, gateway: MqttGateway, queue: SqlQueue
) -> None:
    """``start_telemetry`` for ``run-gateway mqtt``: no table; ready when the queue and the
    broker are reachable; a poll (one device's task) may wait for every try's ack."""
    from dispatcher.mqtt import gateway_metrics as metrics

    def broker() -> None:
        if not gateway.connection.connected:
            raise ConnectionError(f"not connected to MQTT broker {gateway.connection.broker.url}")

    o = gateway.options
    start_telemetry(
        metrics_port,
        service_name="outbox-gateway",
        queue=queue,
        queue_name=o.destination,
        checks=[("broker", broker)],
        poll_budget=o.max_tries * (o.retry_interval + o.publish_timeout) + 60,
    )
    metrics.observe_in_flight(gateway.devices_in_flight)


def queue_depths(queue: CommandQueue) -> Callable[[], dict[str, dict[str, int]]]:
    """``{queue: {state: count}}``: a queue's own ``depths()`` (Service Bus: every runtime
    property count), else its ``stats()`` (the SQL queue: every queue it holds)."""
    depths = getattr(queue, "depths", None)
    if callable(depths):
        return cast("Callable[[], dict[str, dict[str, int]]]", depths)
    return lambda: {
        name: {state: int(getattr(s, state)) for state in QUEUE_STATES}
        for name, s in queue.stats().items()
    }


class StoreProbe:
    """Readiness of the Delta table: its latest version can be read. Its own store (the probe
    runs on the HTTP server's thread), opened at the first probe so a table unreachable at
    start-up is a "not ready", not a crash."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store: DeltaDocumentStore | None = None

    def check(self) -> int:
        from outbox.wiring.backends import open_document_store

        with self._lock:
            if self._store is None:
                self._store = open_document_store(self.settings)
            return self._store.refresh()


class PendingProbe:
    """Pending messages and the oldest one's age: one table scan per scrape, both gauges read
    it. Its own store: the scrape runs on the HTTP server's thread."""

    def __init__(self, settings: Settings) -> None:
        from outbox.wiring.backends import open_document_store

        self.store = open_document_store(settings)
        self._lock = threading.Lock()
        self._value: tuple[float, float] | None = None

    def read(self, *, fresh: bool) -> tuple[float, float]:
        """``fresh``: scan now (the first gauge of a scrape); else the scan the first gauge
        just made (a collection calls the callbacks in the order they were registered)."""
        with self._lock:
            if fresh or self._value is None:
                self._value = self._scan()
            return self._value

    def _scan(self) -> tuple[float, float]:
        self.store.refresh()
        rows = self.store.scan_pending(columns=["dispatched_seq", "last_seq", "outbox"])
        now = datetime.now(UTC)
        messages, oldest = 0, now
        for r in rows.to_pylist():
            messages += int(r["last_seq"]) - int(r["dispatched_seq"])
            for m in r["outbox"] or []:
                created = m.get("created_at")
                if int(m["seq"]) > int(r["dispatched_seq"]) and created is not None:
                    oldest = min(oldest, utc(created))
        return float(messages), (now - oldest).total_seconds()


def use_log_format(log_format: str) -> None:
    """``--log-format json``: every handler on the root logger writes JSON lines."""
    if log_format == "json":
        from outbox.core.telemetry import JsonLogFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLogFormatter())

"""``--metrics-port`` for the long-running commands, and starting the OpenTelemetry SDK for them.

Why a module of its own: ``run-dispatcher`` and ``rescue --every`` share the option and the
start-up, and their modules are edited for other reasons; each needs one decorator and one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from outbox.core import telemetry

if TYPE_CHECKING:
    from dispatcher.queue.sql_queue import SqlQueue

F = TypeVar("F", bound=Callable[..., Any])


def metrics_port_option(f: F) -> F:
    return click.option(
        "--metrics-port",
        type=click.IntRange(1, 65535),
        default=None,
        metavar="PORT",
        help="Serve Prometheus metrics on http://0.0.0.0:PORT/metrics (needs the otel extra). "
        "Traces and metrics also go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.",
    )(f)


def start_telemetry(
    metrics_port: int | None, *, service_name: str, queue: SqlQueue | None = None
) -> None:
    """Install the SDK (when asked for by the option or the OTLP variables); with ``queue``,
    its depth per queue is reported as ``outbox.queue.messages``."""
    telemetry.configure(metrics_port=metrics_port, service_name=service_name)
    if queue is not None:
        telemetry.observe_queue_depth(queue.stats)

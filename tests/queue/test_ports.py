"""The public ports: each is a real ``typing.Protocol``, ``SqlQueue`` and its parts satisfy the
queue's, the facade keeps the ports' signatures, and importing a package for its ports stays light.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Protocol

import pytest

import dispatcher.queue
import dispatcher.transports
import rescuer
from dispatcher.queue import (
    DeferringReceiver,
    QueueAdministration,
    QueueReceiver,
    QueueSender,
    SqlQueue,
)
from dispatcher.queue.ports import RoutingAdministration

PORTS = {
    dispatcher.queue: ["QueueSender", "QueueReceiver", "DeferringReceiver", "QueueAdministration"],
    dispatcher.transports: ["Transport"],
    rescuer: ["CheckpointStore", "CommandSink", "Engine"],
}


@pytest.mark.parametrize(("package", "name"), [(p, n) for p, names in PORTS.items() for n in names])
def test_every_exported_port_is_a_protocol(package: object, name: str) -> None:
    assert name in package.__all__  # type: ignore[attr-defined]
    port = getattr(package, name)
    assert Protocol in port.__mro__
    assert getattr(port, "_is_protocol", False)


def test_the_queue_and_its_parts_satisfy_the_ports(queue: SqlQueue) -> None:
    for port in (QueueSender, QueueReceiver, DeferringReceiver, QueueAdministration):
        assert isinstance(queue, port)
    assert isinstance(queue.receiver, DeferringReceiver)
    assert isinstance(queue.sender, QueueSender)
    assert isinstance(queue.receiver, QueueReceiver)
    assert isinstance(queue.admin, QueueAdministration)
    assert not isinstance(queue.sender, QueueReceiver)


@pytest.mark.parametrize(
    "port",
    [QueueSender, QueueReceiver, DeferringReceiver, QueueAdministration, RoutingAdministration],
)
def test_the_facade_keeps_each_ports_signatures(port: type) -> None:
    for name, member in vars(port).items():
        if name.startswith("_") or not callable(member):
            continue
        if port is QueueReceiver and name in vars(DeferringReceiver):
            continue  # widened there (peek's ``deferred``), compared there
        if port is QueueAdministration and name in vars(RoutingAdministration):
            continue  # widened there (requeue's ``to_queue`` and ``chunk``), compared there
        assert inspect.signature(getattr(SqlQueue, name)) == inspect.signature(member), name


def test_importing_the_ports_loads_no_driver_engine_or_sdk() -> None:
    code = (
        "import sys, dispatcher.queue, dispatcher.transports, rescuer, dispatcher.queue.ports\n"
        "heavy = ('sqlalchemy', 'pyspark', 'azure', 'deltalake', 'pyarrow')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]"

"""Dispatcher fixtures: an outbox per test on an injected clock; crash points disarmed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.testing.crash_points import crash_points


@pytest.fixture(autouse=True)
def _disarm_crash_points() -> Iterator[None]:
    crash_points.disarm()
    yield
    crash_points.disarm()


@pytest.fixture
def memory() -> InMemoryTransport:
    return InMemoryTransport()


@pytest.fixture
def outbox(workspace: Path, clock: ManualClock, memory: InMemoryTransport) -> Iterator[Outbox]:
    ob = Outbox.open(
        workspace, clock=clock, transport=memory, default_destination="shipments", buckets=4
    )
    yield ob
    ob.close()

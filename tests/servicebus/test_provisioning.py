"""``outbox migrate`` provisions the Service Bus command queue: created once with the worker's
properties, left alone when it matches, reported (never changed) when it conflicts."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")

from dispatcher.servicebus import sdk as servicebus_sdk
from dispatcher.servicebus.admin import provision_command_queue
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings
from outbox.testing.servicebus_fake import FakeServiceBus, clients
from outbox.wiring import Backends


def test_migrate_creates_the_command_queue_once(tmp_path: Path) -> None:
    bus = FakeServiceBus(ManualClock())
    settings = Settings(
        workspace=tmp_path / "ws",
        command_transport="servicebus",
        lock_duration=60,
        max_delivery_count=5,
        duplicate_detection_window=3600,
    )
    with servicebus_sdk.use_clients(clients(bus)):
        first = Backends(settings).migrate()
        again = Backends(settings).migrate()
    assert any("created Service Bus queue 'outbox-commands'" in a for a in first.actions)
    assert not any("Service Bus" in a for a in again.actions)
    spec = bus.queues["outbox-commands"].spec
    assert (spec.requires_session, spec.requires_duplicate_detection) == (True, True)
    assert spec.duplicate_detection_history_time_window == timedelta(hours=1)
    assert (spec.max_delivery_count, spec.lock_duration) == (5, timedelta(seconds=60))


def test_a_conflicting_queue_is_reported_and_left_unchanged(tmp_path: Path) -> None:
    bus = FakeServiceBus(ManualClock())
    bus.create_queue("outbox-commands", requires_session=False, max_delivery_count=3)
    admin = bus.admin()
    settings = Settings(workspace=tmp_path / "ws", command_transport="servicebus")
    with pytest.raises(ConfigurationError) as e:
        provision_command_queue(admin, settings)
    assert "requires_session is False" in str(e.value)
    assert "max_delivery_count is 3" in str(e.value)
    assert admin.updated == []
    assert admin.created == []
    assert bus.queues["outbox-commands"].spec.requires_session is False


def test_sql_command_transport_touches_no_service_bus(tmp_path: Path) -> None:
    report = Backends(Settings(workspace=tmp_path / "ws")).migrate()
    assert not any("Service Bus" in a for a in report.actions)

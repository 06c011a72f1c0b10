"""``outbox migrate`` provisions the destinations declared in ``servicebus_destinations`` (queues
with sessions and duplicate detection, ``topic:`` entries as topics with duplicate detection),
through the CLI, text and ``--json``: created once, left alone when they suit, reported (exit 1,
one line each) and never changed when they conflict."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")

from click.testing import CliRunner, Result

from dispatcher.servicebus import sdk as servicebus_sdk
from dispatcher.servicebus.transport import ServiceBusTransport
from dispatcher.transports.base import TransportMessage
from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings
from outbox.testing.servicebus_fake import (
    FakeAdministrationClient,
    FakeServiceBus,
    FakeServiceBusClient,
)

ENV = {
    "OUTBOX_TRANSPORT": "servicebus",
    "OUTBOX_COMMAND_TRANSPORT": "servicebus",
    "OUTBOX_SERVICEBUS_DESTINATIONS": "shipments, topic:events",
    "OUTBOX_DUPLICATE_DETECTION_WINDOW": "1h",
}


class Namespace:
    """The fake namespace, and the one administration client every CLI run gets (so a test can
    see that nothing was ever updated)."""

    def __init__(self) -> None:
        self.bus = FakeServiceBus(ManualClock())
        self.admin = self.bus.admin()

    def clients(self) -> tuple[FakeServiceBusClient, FakeAdministrationClient]:
        return self.bus.client(), self.admin


@pytest.fixture
def ns() -> Iterator[Namespace]:
    namespace = Namespace()
    with servicebus_sdk.use_clients(namespace.clients):
        yield namespace


def run(ws: Path, *args: str, **env: str) -> Result:
    return CliRunner().invoke(main, ["-w", str(ws), "migrate", *args], env={**ENV, **env})


def test_migrate_creates_the_declared_destinations_once(tmp_path: Path, ns: Namespace) -> None:
    first = run(tmp_path / "ws")
    assert first.exit_code == 0, first.output
    created = [ln for ln in first.stdout.splitlines() if "Service Bus" in ln]
    assert created == [
        "- created Service Bus queue 'outbox-commands' (sessions, duplicate detection 3600s, "
        "max delivery count 10, lock 30s)",
        "- created Service Bus queue 'shipments' (sessions, duplicate detection 3600s)",
        "- created Service Bus topic 'events' (duplicate detection 3600s)",
    ]
    queue = ns.bus.queues["shipments"].spec
    assert (queue.requires_session, queue.requires_duplicate_detection) == (True, True)
    assert queue.duplicate_detection_history_time_window == timedelta(hours=1)
    assert (queue.max_delivery_count, queue.lock_duration) == (10, timedelta(minutes=1))  # defaults
    topic = ns.bus.topics["events"].spec
    assert topic.requires_duplicate_detection
    assert topic.duplicate_detection_history_time_window == timedelta(hours=1)

    again = run(tmp_path / "ws", "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["conflicts"] == []
    assert not [a for a in report["actions"] if "Service Bus" in a]  # idempotent
    assert ns.admin.created == ["outbox-commands", "shipments", "events"]
    assert ns.admin.updated == []


def test_conflicting_entities_are_reported_and_never_changed(tmp_path: Path, ns: Namespace) -> None:
    bus = ns.bus
    bus.create_queue("shipments", requires_session=False, requires_duplicate_detection=False)
    bus.create_topic(
        "events",
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=5),
    )
    bus.create_topic(  # a longer window than asked for suits a destination
        "audit",
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(days=1),
    )
    bus.create_topic("taken")  # declared below as a queue: the name is not free
    declared = "shipments,topic:events,topic:audit,taken,fresh"

    text = run(tmp_path / "ws", OUTBOX_SERVICEBUS_DESTINATIONS=declared)
    assert text.exit_code == 1, text.output
    errors = [ln for ln in text.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        "error: Service Bus queue 'shipments' exists with conflicting properties (left "
        "unchanged): requires_duplicate_detection is False, the settings want True; "
        "duplicate_detection_history_time_window is datetime.timedelta(seconds=600), the settings "
        "want datetime.timedelta(seconds=3600); requires_session is False, the settings want True "
        "(fix: recreate it with these properties (they are set at creation only), or give the "
        "destination another name)",
        "error: Service Bus topic 'events' exists with conflicting properties (left unchanged): "
        "duplicate_detection_history_time_window is datetime.timedelta(seconds=300), the settings "
        "want datetime.timedelta(seconds=3600) (fix: recreate it with these properties (they are "
        "set at creation only), or give the destination another name)",
        "error: Service Bus queue 'taken' cannot be created: an entity of another kind has that "
        "name (fix: recreate it with these properties (they are set at creation only), or give "
        "the destination another name)",
    ]
    # what did not conflict was still provisioned
    assert "- created Service Bus queue 'fresh' (sessions, duplicate detection 3600s)" in (
        text.stdout.splitlines()
    )

    as_json = run(tmp_path / "ws", "--json", OUTBOX_SERVICEBUS_DESTINATIONS=declared)
    assert as_json.exit_code == 1, as_json.output
    report = json.loads(as_json.stdout)
    assert [c.split(" exists")[0].split(" cannot")[0] for c in report["conflicts"]] == [
        "Service Bus queue 'shipments'",
        "Service Bus topic 'events'",
        "Service Bus queue 'taken'",
    ]
    assert report["changed"] is False
    assert ns.admin.updated == []
    assert ns.admin.created == ["outbox-commands", "fresh"]
    assert bus.queues["shipments"].spec.requires_session is False  # left as it was
    assert bus.topics["events"].spec.duplicate_detection_history_time_window == timedelta(minutes=5)


def test_a_conflicting_command_queue_is_in_the_json_report(tmp_path: Path, ns: Namespace) -> None:
    ns.bus.create_queue("outbox-commands", requires_session=False)
    result = run(tmp_path / "ws", "--json", OUTBOX_SERVICEBUS_DESTINATIONS="")
    assert result.exit_code == 1, result.output
    [conflict] = json.loads(result.stdout)["conflicts"]
    assert conflict.startswith("Service Bus queue 'outbox-commands' exists with conflicting")
    assert "requires_session is False" in conflict
    assert "or use another command_queue" in conflict


def test_a_bad_destination_entry_is_one_line(tmp_path: Path) -> None:
    result = run(tmp_path / "ws", OUTBOX_SERVICEBUS_DESTINATIONS="shipments,topic:")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: setting 'servicebus_destinations' is invalid: 'topic:' is not a queue name or "
        "topic:NAME; names are 1-260 letters, digits, '.', '-', '_' or '/', starting with a "
        "letter or digit"
    ]


def test_the_transport_sends_declared_topics_to_topics(ns: Namespace) -> None:
    settings = Settings(servicebus_destinations=("topic:events",))
    ns.bus.create_topic("events", requires_duplicate_detection=True)
    transport = ServiceBusTransport.from_settings(settings, env={})
    transport.send([TransportMessage("m1", "events", b"{}", session_id="d1")])
    transport.send([TransportMessage("m1", "events", b"{}", session_id="d1")])  # a re-send
    transport.close()
    assert [s.message_id for s in ns.bus.topics["events"].accepted] == ["m1"]
    with pytest.raises(ConfigurationError, match="a queue in servicebus_destinations"):
        ServiceBusTransport.from_settings(
            Settings(servicebus_destinations=("events",)),
            env={"OUTBOX_SERVICEBUS_TOPICS": "events"},
        )

"""The Service Bus command queue against a real namespace, when one is configured.

Runs when ``OUTBOX_SERVICEBUS_CONNECTION_STRING`` (or ``OUTBOX_SERVICEBUS_NAMESPACE`` with
azure-identity) is set; each run provisions its own queue (``outbox migrate``'s code) and deletes
it afterwards. Waits are the service's own (``max_wait_time`` of a receive), never sleeps.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")

from dispatcher.queue.messages import QueueMessage
from dispatcher.servicebus.admin import provision_command_queue
from dispatcher.servicebus.command_queue import ServiceBusCommandQueue, connect
from dispatcher.servicebus.sdk import ENV_CONNECTION_STRING, ENV_NAMESPACE
from outbox.core.settings import Settings

pytestmark = pytest.mark.skipif(
    not (os.environ.get(ENV_CONNECTION_STRING) or os.environ.get(ENV_NAMESPACE)),
    reason=f"live Service Bus tests need {ENV_CONNECTION_STRING} or {ENV_NAMESPACE} (with "
    "azure-identity); the fake-broker tests in tests/servicebus cover the same behaviour offline",
)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[ServiceBusCommandQueue]:
    name = f"outbox-live-{uuid.uuid4().hex[:12]}"
    settings = Settings(
        workspace=tmp_path / "ws",
        command_queue=name,
        command_transport="servicebus",
        max_delivery_count=3,
        duplicate_detection_window=60,
    )
    client, admin = connect()
    provision_command_queue(admin, settings)
    queue = ServiceBusCommandQueue(
        client, admin, command_queue=name, max_delivery_count=3, max_wait_time=15
    )
    try:
        assert provision_command_queue(admin, settings) == []  # idempotent
        yield queue
    finally:
        queue.close()
        admin.delete_queue(name)
        admin.close()
        client.close()


def test_send_receive_settle_and_retry_with_delay(live: ServiceBusCommandQueue) -> None:
    q = live.command_queue
    live.send(q, [QueueMessage(b"one", message_id="c1", session_id="doc-1")])
    live.send(q, [QueueMessage(b"one", message_id="c1", session_id="doc-1")])  # dropped
    [m] = live.receive(q)
    assert (m.message_id, m.session_id, m.delivery_count) == ("c1", "doc-1", 1)
    assert live.renew_lock(m) > m.locked_until  # type: ignore[operator]
    live.abandon(m, delay=2)
    [again] = live.receive(q)  # the scheduled copy, once its time comes
    assert (again.message_id, again.delivery_count) == ("c1", 2)
    live.dead_letter(again, "Poison", "checked live")
    [dl] = live.list_dead_letters()
    assert (dl.message_id, dl.reason, dl.session_id) == ("c1", "Poison", "doc-1")
    assert live.purge(all=True) == 1
    assert live.receive(q) == []

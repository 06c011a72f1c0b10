"""The CLI with ``command_transport = "servicebus"`` on the kit's fake namespace (in-process, via
``servicebus_sdk.use_clients``): ``migrate`` creates the command queue, ``run-dispatcher`` receives
from it, ``dead-letters`` and ``status`` read its dead-letter subqueue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("azure.servicebus")

from click.testing import CliRunner

from dispatcher.commands import COMMAND_SUBJECT
from dispatcher.queue.messages import QueueMessage
from dispatcher.servicebus import sdk as servicebus_sdk
from dispatcher.servicebus.command_queue import ServiceBusCommandQueue
from outbox.app.cli import main
from outbox.core.clock import ManualClock
from outbox.testing.servicebus_fake import FakeServiceBus, clients

ENV = {"OUTBOX_COMMAND_TRANSPORT": "servicebus", "OUTBOX_TRANSPORT": "memory"}


@pytest.fixture
def bus() -> Iterator[FakeServiceBus]:
    fake = FakeServiceBus(ManualClock())
    with servicebus_sdk.use_clients(clients(fake)):
        yield fake


def run(ws: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-w", str(ws), *args], env=ENV)
    return result.exit_code, result.output


def test_migrate_run_dispatcher_dead_letters_and_status(
    tmp_path: Path, bus: FakeServiceBus
) -> None:
    ws = tmp_path / "ws"
    code, out = run(ws, "migrate")
    assert code == 0, out
    assert "outbox-commands" in bus.queues
    assert bus.queues["outbox-commands"].spec.requires_session

    queue = ServiceBusCommandQueue(bus.client(), bus.admin(), clock=bus.clock)
    queue.send(
        "outbox-commands",
        QueueMessage(
            b"{not json", message_id="poison", session_id="doc-1", subject=COMMAND_SUBJECT
        ),
    )
    result = CliRunner().invoke(
        main, ["-w", str(ws), "run-dispatcher", "--once", "--json"], env=ENV
    )
    # --once exits 1 when a command was dead-lettered (cron sees it); the reason is on stderr
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["dead_lettered"] == 1
    assert "dead-lettered" in result.stderr

    code, out = run(ws, "dead-letters", "list", "--json")
    assert code == 0, out
    [dl] = json.loads(out)
    assert (dl["message_id"], dl["session_id"], dl["reason"]) == (
        "poison",
        "doc-1",
        "MalformedCommand",
    )
    code, out = run(ws, "dead-letters", "show", str(dl["id"]), "--json")
    assert json.loads(out)["reason"] == "MalformedCommand"
    code, out = run(ws, "dead-letters", "--sql", "list", "--json")
    assert (code, json.loads(out)) == (0, [])

    code, out = run(ws, "status", "--json")
    assert code == 0, out
    depths = {q["queue"]: q for q in json.loads(out)["queues"]}
    assert depths["outbox-commands"]["dead_lettered"] == 1

    code, out = run(ws, "dead-letters", "requeue", "--all", "--json")
    assert json.loads(out) == {"requeued": 1}
    [again] = bus.messages("outbox-commands")
    assert (again.session_id, again.deliveries) == ("doc-1", 0)
    code, out = run(ws, "run-dispatcher", "--once", "--json")
    code, out = run(ws, "dead-letters", "purge", "--all", "--yes", "--json")
    assert json.loads(out) == {"purged": 1}
    assert bus.dead_letters("outbox-commands") == []
    queue.close()

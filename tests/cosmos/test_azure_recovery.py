"""The crash-recovery proof on the Azure parts together, through the CLI: the Service Bus fake
(in-process, ``servicebus_sdk.use_clients``) carries the commands and the destination, the local
Cosmos-protocol server holds the rescuer's checkpoint.

1. ``outbox migrate`` creates the Delta table, the Cosmos containers, the Service Bus command
   queue and the declared destination queue ``shipments``;
2. a document is written and dispatched at once; then a unit of work (that document extended,
   two new ones) dies right after its Delta commit, before its immediate dispatch sends anything;
3. ``outbox rescue`` (its clock past the rescue delay) stores its checkpoint in Cosmos DB and
   sends one ``ProcessDocument`` per stranded document to the command queue;
4. ``outbox run-dispatcher --once`` receives them there and delivers the stranded messages to
   ``shipments``; every command is completed, none dead-lettered;
5. a session consumer on ``shipments`` gets every committed message exactly once, each
   document's in commit order.

The same scenario with an inert rescuer (its sink enqueues nothing, as the checker's
``rescuer-enqueues-nothing`` mutation does) must lose the stranded messages: the proof can fail.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")

from azure.servicebus import NEXT_AVAILABLE_SESSION
from azure.servicebus.exceptions import OperationTimeoutError
from click.testing import CliRunner

from dispatcher.servicebus import sdk as servicebus_sdk
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore
from outbox.testing.crash_points import InjectedCrash, crash_points
from outbox.testing.servicebus_fake import FakeServiceBus, clients
from outbox.wiring import Backends
from rescuer.checkpoint_cosmos import CosmosCheckpointStore
from rescuer.sink import QueueSink
from tests.dispatcher.helpers import write_docs

COMMANDS = "outbox-commands"
DESTINATION = "shipments"


def _env(settings: Settings) -> dict[str, str]:
    return {
        "OUTBOX_TRANSPORT": "servicebus",
        "OUTBOX_COMMAND_TRANSPORT": "servicebus",
        "OUTBOX_SERVICEBUS_DESTINATIONS": DESTINATION,
        "OUTBOX_DEFAULT_DESTINATION": DESTINATION,
        "OUTBOX_CHECKPOINT_STORE": "cosmos",
        "OUTBOX_COSMOS_ENDPOINT": settings.cosmos_endpoint,
        "OUTBOX_COSMOS_KEY": settings.cosmos_key,
        "OUTBOX_COSMOS_DATABASE": settings.cosmos_database,
    }


def _cli(ws: str, env: dict[str, str], *args: str) -> Any:
    result = CliRunner().invoke(main, ["-w", ws, *args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _consume(bus: FakeServiceBus) -> list[tuple[str, str]]:
    """What a session consumer of the destination receives: (session, message id), each
    session's messages in order, every one completed."""
    client = bus.client()
    got: list[tuple[str, str]] = []
    while True:
        try:
            receiver = client.get_queue_receiver(DESTINATION, session_id=NEXT_AVAILABLE_SESSION)
            with receiver:
                for m in receiver.receive_messages(max_message_count=100):
                    got.append((str(m.session_id), str(m.message_id)))
                    receiver.complete_message(m)
        except OperationTimeoutError:  # no session with a message left
            return got


def _lost_or_repeated(
    committed: dict[str, list[OutboxMessage]], got: Sequence[tuple[str, str]]
) -> list[str]:
    problems = []
    for doc, msgs in committed.items():
        want = [m.message_id for m in msgs]
        have = [mid for session, mid in got if session == doc]
        if have != want:
            problems.append(f"{doc}: delivered {have}, committed {want}")
    return problems


@pytest.mark.parametrize("rescuer", ["working", "inert"])
@pytest.mark.slow  # seconds each: left out of the fast lane
def test_crash_after_commit_is_recovered_on_service_bus_and_cosmos(
    cosmos_settings: Settings,
    cosmos_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    rescuer: str,
) -> None:
    ws = str(cosmos_settings.workspace)
    env = _env(cosmos_settings)
    bus = FakeServiceBus(ManualClock(datetime.now(UTC)))
    if rescuer == "inert":
        monkeypatch.setattr(QueueSink, "enqueue", lambda self, commands: 0)
    try:
        with servicebus_sdk.use_clients(clients(bus)):
            _scenario(ws, env, bus, monkeypatch, inert=rescuer == "inert")
    finally:
        cosmos_client.delete_database(cosmos_settings.cosmos_database)


def _scenario(
    ws: str,
    env: dict[str, str],
    bus: FakeServiceBus,
    monkeypatch: pytest.MonkeyPatch,
    *,
    inert: bool,
) -> None:
    actions = _cli(ws, env, "migrate")["actions"]
    assert {a.split(" (")[0] for a in actions if "Service Bus" in a} == {
        f"created Service Bus queue {COMMANDS!r}",
        f"created Service Bus queue {DESTINATION!r}",
    }
    settings = Settings.load(ws, env=env)

    # -- the writer: one dispatched document, then a crash right after a commit
    committed: dict[str, list[OutboxMessage]] = {}
    ob = Outbox.open(settings=settings, create=False)
    try:
        write_docs(ob, committed, 1, 2, prefix="pkg")
        assert len(bus.messages(DESTINATION)) == 2  # sent at once
        crash_points.arm("after_commit")
        try:
            with pytest.raises(InjectedCrash):
                write_docs(ob, committed, 3, 2, prefix="pkg")  # pkg0 extended, pkg1, pkg2
        finally:
            crash_points.disarm()
    finally:
        with contextlib.suppress(Exception):  # the writer "died": close what is left
            ob.close()
    assert len(bus.messages(DESTINATION)) == 2  # nothing of the crashed commit was sent

    # -- the rescuer, its clock past the rescue delay (no sleep)
    store = DeltaDocumentStore(settings.table_uri)
    version = store.version()
    ts = int(store.delta_table.history(1)[0]["timestamp"])
    store.close()
    later = datetime.fromtimestamp(ts / 1000, tz=UTC) + timedelta(seconds=60)
    monkeypatch.setattr("outbox.app.cli.rescue.SystemClock", lambda: ManualClock(later))
    report = _cli(ws, env, "rescue")
    assert report["checkpoint_after"] == version
    with Backends(settings) as backends:
        checkpoints = backends.checkpoint_store()
        assert isinstance(checkpoints, CosmosCheckpointStore)
        [cp] = checkpoints.list()
    assert (cp.table_uri, cp.version) == (settings.table_uri, version)

    # -- the worker, receiving from the Service Bus command queue
    stats = _cli(ws, env, "run-dispatcher", "--once")
    got = _consume(bus)
    problems = _lost_or_repeated(committed, got)

    if inert:
        assert report["commands_enqueued"] == 0
        assert stats["commands"] == 0
        assert problems == [
            f"pkg0: delivered {[m.message_id for m in committed['pkg0'][:2]]}, "
            f"committed {[m.message_id for m in committed['pkg0']]}",
            f"pkg1: delivered [], committed {[m.message_id for m in committed['pkg1']]}",
            f"pkg2: delivered [], committed {[m.message_id for m in committed['pkg2']]}",
        ]
        return
    assert report["commands_enqueued"] == 3
    assert (stats["commands"], stats["completed"], stats["dead_lettered"]) == (3, 3, 0)
    assert problems == []
    assert len(got) == sum(len(m) for m in committed.values()) == 8  # exactly once
    assert bus.messages(COMMANDS) == []  # every command completed ...
    assert bus.dead_letters(COMMANDS) == []  # ... none dead-lettered
    store = DeltaDocumentStore(settings.table_uri)
    assert store.scan_pending().num_rows == 0
    store.close()

"""A dead-lettered ``ProcessDocument`` command: ``outbox status`` flags its document, and
``outbox dead-letters requeue`` re-drives it.

Nothing re-drives such a document on its own: a rescue pass in feed mode only commands documents
that changed in its window, and a repeated command id is dropped by duplicate detection. The
documented path (docs/rescuer.md) is the manual one, proven here end to end through the CLI.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dispatcher.commands import ProcessDocument
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.app.status import collect_status
from outbox.core.clock import ManualClock
from outbox.testing.faulty import FaultyTransport

COMMANDS = "outbox-commands"


def outbox_cli(workspace: Path, *args: str) -> Result:
    """The command as an operator types it, run by click's runner in this process: a child
    process each (seconds of start-up) proved nothing more here (callers assert on the exit
    code with the output in the message)."""
    return CliRunner().invoke(main, ["-w", str(workspace), *args])


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_a_dead_lettered_command_is_flagged_and_requeue_dispatches_the_document(
    workspace: Path, clock: ManualClock
) -> None:
    # The CLI runs on the wall clock and schedules a requeued command at its "now": keep the
    # injected clock on wall time so the worker sees it as due.
    clock.set(datetime.now(UTC))
    faulty = FaultyTransport(InMemoryTransport(), clock=clock)
    with Outbox.open(
        workspace,
        clock=clock,
        transport=faulty,
        default_destination="d",
        dispatch="deferred",
        max_delivery_count=2,
    ) as ob:
        with ob.unit_of_work() as uow:
            uow.create("stuck", type="Shipment").send("Left", {"at": "Seattle"})
        faulty.outage()
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert stats.dead_lettered == 1

        report = collect_status(ob.settings, clock)
        assert report.pending_documents == 1
        assert report.dead_lettered_documents == 1
        (flagged,) = report.dead_lettered_commands
        assert (flagged.document_id, flagged.last_seq, flagged.dispatched_seq) == ("stuck", 1, 0)
        assert flagged.up_to_seq == 1
        assert flagged.reason == "MaxDeliveryCountExceeded"

        shown = outbox_cli(workspace, "status", "--json")
        assert shown.exit_code == 0, shown.output
        data = json.loads(shown.stdout)
        assert data["dead_lettered_documents"] == 1
        assert data["dead_lettered_commands"][0]["document_id"] == "stuck"
        human = outbox_cli(workspace, "status")
        assert "whose command is dead-lettered" in human.stdout, human.output

        faulty.heal()  # the cause is fixed; now the operator re-drives the command
        requeued = outbox_cli(
            workspace,
            "dead-letters",
            "requeue",
            "--where",
            f"queue={COMMANDS}",
            "--where",
            "session_id=stuck",
            "--json",
        )
        assert requeued.exit_code == 0, requeued.output
        assert json.loads(requeued.stdout) == {"requeued": 1}

        clock.set(max(clock.now(), datetime.now(UTC)))
        stats = DispatcherWorker(ob.runtime).run(until_idle=True)
        assert stats.completed == 1
        _, rows = ob.store.read(["stuck"])
        assert rows["stuck"].dispatched_seq == rows["stuck"].last_seq == 1
        delivered = faulty.inner.deliveries  # type: ignore[attr-defined]
        assert [(m.subject, m.session_id) for m in delivered] == [("Left", "stuck")]

        after = collect_status(ob.settings, clock)
        assert (after.pending_documents, after.dead_lettered_documents) == (0, 0)
        assert after.dead_lettered_commands == []


def test_only_pending_documents_of_this_table_are_flagged(
    workspace: Path, clock: ManualClock
) -> None:
    """A dead letter for a document dispatched since, or for another table, is history."""
    with Outbox.open(
        workspace, clock=clock, transport=InMemoryTransport(), default_destination="d"
    ) as ob:
        with ob.unit_of_work() as uow:
            uow.create("done", type="Shipment").send("Left", {})
        queue = ob.runtime.queue
        for cmd in (
            ProcessDocument(ob.store.table_id, "done", 1),
            ProcessDocument("another-table", "done", 1),
        ):
            queue.send(COMMANDS, cmd.to_queue_message())
            (msg,) = queue.receive(COMMANDS, 1)
            queue.dead_letter(msg, "Test")

        writer = ob.runtime.watermarks  # status reads the table as another process would:
        assert writer is None or writer.flush(30)  # the watermark is there once written
        report = collect_status(ob.settings, clock)
        assert report.pending_documents == 0
        assert report.dead_lettered_documents == 0
        assert report.oldest_dead_letter is not None

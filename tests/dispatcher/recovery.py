"""Recovery as the rescuer and worker would do it, and the delivery log of a SQL-transport run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dispatcher.invariants import InvariantReport, verify_deliveries
from dispatcher.transports.base import TransportMessage
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.model import OutboxMessage


def committed_messages(ob: Outbox) -> dict[str, list[OutboxMessage]]:
    """Every message the table holds (the tests never save a document after dispatch)."""
    ids = sorted(
        {str(i) for i in ob.store.delta_table.to_pyarrow_table(columns=["id"])["id"].to_pylist()}
    )
    _, rows = ob.store.read(ids)
    return {i: sorted(r.outbox, key=lambda m: m.seq) for i, r in rows.items()}


def recover(ob: Outbox) -> None:
    """Enqueue ProcessDocument for every pending document (a rescue pass) and drain the worker."""
    pending = ob.store.scan_pending().to_pylist()
    ob.runtime.enqueue_commands((str(r["id"]), int(r["last_seq"])) for r in pending)
    DispatcherWorker(ob.runtime, batch_size=8, poll_interval=1.0).run(until_idle=True)


def sql_deliveries(ob: Outbox, destination: str = "shipments") -> list[TransportMessage]:
    return [
        TransportMessage(
            message_id=p.message_id, destination=destination, body=p.body, session_id=p.session_id
        )
        for p in ob.runtime.queue.peek(destination, limit=100_000)
    ]


def recover_and_verify(workspace: Path) -> tuple[InvariantReport, Outbox]:
    """Open the workspace an hour later (killed workers' locks have expired) and recover."""
    clock = ManualClock(datetime.now(UTC) + timedelta(hours=1))
    ob = Outbox.open(workspace, clock=clock, create=False)
    recover(ob)
    report = verify_deliveries(committed_messages(ob), sql_deliveries(ob))
    return report, ob

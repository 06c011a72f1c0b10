"""A document's whole life in its trace (issue 46, item 1's check): created by a Spark job,
changed by an application whose process died between its commit and its dispatch (a save with
no dispatcher stands for it: committed, nothing sent, no command), rescued by the rescuer (a
pass enqueues the ProcessDocument command, the worker sends), its message dead-lettered by a
consumer and requeued by an operator. ``outbox trace`` and the console's trace page tell it:
the Spark job, the application and the dispatcher's marks as the writers, each message's fate.
With the rescuer made inert (it enqueues nothing) the rescued message stays pending in the trace,
so the check can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dispatcher.queue.sql_queue import SqlQueue
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.clock import SystemClock
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore

pytestmark = pytest.mark.spark

CHANGES = (
    "id string, type string, state string, expected_version bigint, "
    "messages array<struct<type:string, body:string>>"
)
QUEUE = "shipments"


def _cli(ws: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["-w", str(ws), *args])


def _rescue(ws: Path, *, inert: bool) -> None:
    """One rescue pass and the worker until idle, as tests/spark/test_mixed_writers.py runs
    them; ``inert``: the shipped mutation whose sink enqueues nothing."""
    from datetime import timedelta

    from dispatcher.worker import DispatcherWorker
    from outbox.app.checker import mutations
    from outbox.app.checker.rescue import OffsetClock
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import InMemoryCheckpointStore
    from rescuer.journal import SqlRescueJournal
    from rescuer.runner import RescuePass

    with Outbox.open(ws, create=False) as ob:
        sink: Any = ob.backends.command_sink()
        if inert:
            sink = mutations.get("rescuer-enqueues-nothing").wrap_sink(sink)
        rescue = RescuePass(
            ob.store,
            LocalEngine(),
            InMemoryCheckpointStore(),
            sink,
            clock=OffsetClock(timedelta(hours=1).total_seconds()),
            delay=ob.settings.rescue_delay,
        )
        rescue.journal = SqlRescueJournal(ob.backends.sql_queue.database)  # as open_rescuer
        rescue.run()
        DispatcherWorker(ob.runtime, batch_size=16, poll_interval=0.01).run(until_idle=True)


def _life(spark: Any, ws: Path, *, inert_rescuer: bool) -> dict[str, Any]:
    from outbox.app.spark import SparkOutbox

    ws.mkdir()
    (ws / "outbox.toml").write_text(
        f'sql_url = "sqlite:///{ws / "outbox.db"}"\ntransport = "sql"\nbuckets = 4\n'
        f'compact_every = 0\ndefault_destination = "{QUEUE}"\nsample_interval = 0\n'
    )
    sob = SparkOutbox(spark, ws)
    try:  # 1. a Spark job creates it; its message goes out right after the commit
        sob.apply(
            spark.createDataFrame(
                [("order-1", "Order", '{"status": "placed"}', 0, [("Placed", '{"n": 1}')])],
                CHANGES,
            )
        )
    finally:
        sob.close()
    # 2. an application saves a change and dies before dispatching it: committed, nothing sent
    settings = Settings.load(ws)
    bare = Outbox(settings, DeltaDocumentStore(settings.table_uri), clock=SystemClock())
    with bare.unit_of_work() as uow:
        doc = uow.get("order-1")
        assert doc is not None
        doc.state["status"] = "shipped"
        doc.send("Shipped", {"n": 2})
    bare.close()
    # 3. the rescuer (its clock an hour on: past the delay) finds it pending and commands it;
    # the worker sends it
    _rescue(ws, inert=inert_rescuer)
    # 4. a consumer dead-letters "Shipped"; 5. an operator requeues it
    with SqlQueue(settings.sql_url) as q:
        for m in q.receive(QUEUE, 10):
            if m.subject == "Shipped":
                q.dead_letter(m, "BadAddress", "no such street")
            else:
                q.abandon(m)
        dead = q.list_dead_letters(QUEUE, 10)
        if dead:
            assert q.requeue(ids=[d.id for d in dead]) == 1
    traced = _cli(ws, "trace", "order-1", "--json")
    assert traced.exit_code == 0, traced.output
    data: dict[str, Any] = json.loads(traced.stdout)
    return data


def test_a_life_with_spark_a_rescued_crash_a_dead_letter_and_a_requeue(
    spark: Any, tmp_path: Path
) -> None:
    data = _life(spark, tmp_path / "ws", inert_rescuer=False)
    [doc] = data["documents"]
    writers = [c["writer"] for c in doc["commits"]]
    assert writers[0] == "spark"  # the job's commit created it
    assert "outbox" in writers  # the application's save
    assert "dispatcher" in writers  # the marks of what was sent
    added = {m: c["writer"] for c in doc["commits"] for m in c["added"]}
    fates = {m["type"]: m for m in doc["messages"]}
    assert added[fates["Placed"]["message_id"]] == "spark"
    assert added[fates["Shipped"]["message_id"]] == "outbox"
    assert not fates["Shipped"]["pending"]  # the rescuer's command had it sent
    [rescued] = doc["rescues"]  # the pass that commanded it, after its command was handled
    assert rescued["up_to_seq"] == fates["Shipped"]["seq"]
    assert fates["Shipped"]["fate"] == "active"  # requeued: waiting in its queue again
    assert fates["Shipped"]["queued"]["delivery_count"] == 0
    assert fates["Shipped"]["dead_letter"] is None
    assert fates["Placed"]["fate"] == "active"  # abandoned back to its queue
    assert doc["dispatched_seq"] == doc["last_seq"] == 2


def test_with_an_inert_rescuer_the_trace_shows_the_message_still_pending(
    spark: Any, tmp_path: Path
) -> None:
    data = _life(spark, tmp_path / "ws", inert_rescuer=True)
    [doc] = data["documents"]
    fates = {m["type"]: m for m in doc["messages"]}
    assert fates["Shipped"]["pending"]
    assert fates["Shipped"]["fate"] == "pending"
    assert doc["dispatched_seq"] == 1

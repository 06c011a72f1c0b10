"""Mixed writers on one table: Spark applies beside Python units of work, one driver crash.

Spark applies batches with messages (blind updates, state kept) to documents in buckets 1-3
while a Python writer saves through ``unit_of_work`` in bucket 0: the literal bucket filters let
both commit side by side. Python also changes some of Spark's documents between two applies, and
Spark's later blind updates must keep that state (no lost update). Why not the same buckets at
the same time: a Spark MERGE takes seconds, and a Python writer committing to its buckets every
few milliseconds makes it lose every optimistic-concurrency race (docs/spark.md, limits). The
second Spark apply dies right after its commit, before dispatch (``InjectedCrash`` at the
``after_commit`` step: the state it leaves is the one a SIGKILL leaves, see test_streaming.py for
the real kill). Afterwards a rescuer sweep and the command worker deliver everything: no lost
update, no lost message, first deliveries in seq order per document, no phantom.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app import Outbox
from outbox.core.errors import CommitConflictError, ConcurrencyError
from outbox.core.model import bucket_of, message_id_for
from outbox.testing.crash_points import CrashPoints, InjectedCrash
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.runner import RescuePass
from rescuer.sink import QueueSink

pytestmark = pytest.mark.spark

BUCKETS = 4
SPARK_DOCS = [d for d in (f"doc-{i}" for i in range(80)) if bucket_of(d, BUCKETS) != 0][:60]
PY_DOCS = [d for d in (f"py-{i}" for i in range(40)) if bucket_of(d, BUCKETS) == 0][:4]
SHARED = SPARK_DOCS[:4]  # changed by Python between two Spark applies


def spark_changes(spark: Any, round_no: int) -> Any:
    rows = [(d, "shipment", None, None, [("Scanned", f"r{round_no}")]) for d in SPARK_DOCS]
    return spark.createDataFrame(
        rows,
        "id string, type string, state string, expected_version bigint, "
        "messages array<struct<type:string, body:string>>",
    )


def test_spark_and_python_writers_with_a_crash_after_commit(spark: Any, tmp_path: Path) -> None:
    from outbox.spark import SparkOutbox

    memory = InMemoryTransport()
    options: dict[str, Any] = {"buckets": BUCKETS, "compact_every": 0, "default_destination": "d"}
    ob = Outbox.open(tmp_path / "ws", transport=memory, **options)
    sob = SparkOutbox(spark, tmp_path / "ws", transport=memory, **options)
    crash = CrashPoints()
    sob.runtime.crash_points = crash  # only the Spark driver's dispatch crashes
    saves: dict[str, int] = defaultdict(int)
    stop = threading.Event()

    def save(doc_id: str) -> bool:
        try:
            with ob.unit_of_work() as uow:
                doc = uow.get(doc_id) or uow.create(doc_id, type="shipment")
                doc.state["py"] = doc.state.get("py", 0) + 1
                doc.send("Touched", {"n": doc.state["py"]})
        except (ConcurrencyError, CommitConflictError):
            return False
        saves[doc_id] += 1
        return True

    def python_writer() -> None:
        i = 0
        while not stop.is_set() or i < 12:
            i += save(PY_DOCS[i % len(PY_DOCS)])

    writer = threading.Thread(target=python_writer)
    sob.apply(spark_changes(spark, 0))
    for doc_id in SHARED:
        assert save(doc_id)
    writer.start()
    try:
        crash.arm("after_commit")
        with pytest.raises(InjectedCrash):
            sob.apply(spark_changes(spark, 1))
        sob.apply(spark_changes(spark, 2))
    finally:
        stop.set()
        writer.join()

    # The rescuer (a full sweep) enqueues commands; the worker delivers what is left.
    store = ob.store
    sink = QueueSink.from_settings(ob.settings)
    RescuePass(store, LocalEngine(), InMemoryCheckpointStore(), sink, delay=15).run(full=True)
    sink.close()
    DispatcherWorker(ob.runtime).run(until_idle=True)

    _, rows = store.read(SPARK_DOCS + PY_DOCS)
    assert len(rows) == len(SPARK_DOCS) + len(PY_DOCS)
    first: dict[str, list[int]] = defaultdict(list)
    expected: dict[str, tuple[str, int]] = {}
    for row in rows.values():
        assert row.dispatched_seq == row.last_seq, row.id  # nothing left pending
        for seq in range(1, row.last_seq + 1):
            expected[message_id_for(store.table_id, row.id, seq, row.incarnation)] = (row.id, seq)
    seen: set[str] = set()
    for m in memory.deliveries:
        assert m.message_id in expected, "phantom"
        if m.message_id not in seen:
            seen.add(m.message_id)
            doc_id, seq = expected[m.message_id]
            first[doc_id].append(seq)
    assert seen == set(expected), "lost messages"
    for doc_id, seqs in first.items():
        assert seqs == sorted(seqs), doc_id
    for row in rows.values():
        py = saves.get(row.id, 0)
        spark_messages = 3 if row.id in SPARK_DOCS else 0
        assert row.last_seq == spark_messages + py  # one message per save: none lost
        assert row.state.get("py", 0) == py  # Spark kept the state: no lost update
    assert sum(saves[d] for d in PY_DOCS) >= 12
    ob.close()
    sob.close()

"""The external delete and re-create: an erasure job deletes a document outside the library, and
the application creates it again under the same id.

Why the checker does this: message ids are derived from (table, id, incarnation, seq). Without
the incarnation a re-created document would restart at seq 1 with its old messages' ids, and
duplicate detection (the queue's, Service Bus's, a consumer's inbox) would drop the new ones: a
loss no other fault produces. The supervisor deletes a document whose messages were all sent
(``dispatched_seq = last_seq`` in the snapshot the delete commits on, so nothing pending is
erased), creates it again with new messages and hands it to the workers through a
``ProcessDocument`` command; the second drain must deliver them like any other.
"""

from __future__ import annotations

import time
from typing import Any

from outbox.app.checker.execute import PASS_EVERY, Run, drain_step
from outbox.app.checker.procs import DESTINATION

RECREATED_MESSAGES = 3


def delete_and_recreate(run: Run, broken: Any, *, wait: float) -> None:
    """Delete one fully dispatched document, create it again with new messages, enqueue its
    command; sets ``run.recreated`` when it happened and clears ``drained`` for the next drain.

    The step needs a fully dispatched document, read from the table. After a drain that
    finished every document is one; after a drain that timed out (a loaded machine, or a broken
    build's short drain in the mutation tests) the step waits for one, up to ``wait`` seconds
    while the drain's steps go on, rather than being skipped: the CI run that found this (issue
    42) lost the step to a drain that needed more than the 8 s the test gave it. Only a seed
    that committed nothing, or got nothing dispatched by then (a broken build that lowers
    every watermark), goes without it, and the report names the fault as unfired.
    """
    deadline = time.monotonic() + wait
    while True:
        doc_id, committed = _delete_a_dispatched_document(run)
        if doc_id is not None:
            break
        if not committed or time.monotonic() >= deadline:
            why = "nothing was committed" if not committed else "no document got dispatched"
            run.say(f"{why}: the re-create step did not run")
            return
        drain_step(run)  # the workers and the rescuer go on meanwhile
        time.sleep(PASS_EVERY)
    _recreate(run, doc_id, broken)
    run.recreated = doc_id
    run.report.drained = False
    run.say(f"deleted {doc_id!r} outside the library and created it again")


def _delete_a_dispatched_document(run: Run) -> tuple[str | None, int]:
    """Delete every row of one document whose messages were all sent: (its id or None, how
    many documents have committed messages at all)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from outbox.delta.versions import latest_rows

    settings = run.settings
    table = DeltaTable(settings.table_uri, storage_options=settings.storage_options or None)
    columns = ["id", "version", "last_seq", "dispatched_seq", "incarnation"]
    rows = latest_rows(table.to_pyarrow_table(columns=columns)).to_pylist()
    committed = [r for r in rows if r["last_seq"] > 0]
    done = sorted(r["id"] for r in committed if r["dispatched_seq"] == r["last_seq"])
    for doc_id in done:
        quoted = doc_id.replace("'", "''")
        # Every row of the document (a row per version), from the snapshot that found it fully
        # dispatched: a writer that appended a version since makes this commit fail (a
        # concurrent write to the rows it deletes), and the next document is tried.
        try:
            metrics = table.delete(f"id = '{quoted}'")
        except CommitFailedError:
            table.update_incremental()
            continue
        if int(metrics.get("num_deleted_rows", 0)):
            return doc_id, len(committed)
    return None, len(committed)


def _recreate(run: Run, doc_id: str, broken: Any) -> None:
    from contextlib import nullcontext

    from dispatcher.commands import commands_for
    from outbox.core.clock import SystemClock
    from outbox.unit_of_work import UnitOfWork

    store = run.store
    store.refresh()
    with broken.supervisor_writes() if broken else nullcontext():
        uow = UnitOfWork(store, run.settings, SystemClock())
        with uow:
            doc = uow.create(doc_id, type="package")
            doc.state["recreated"] = True
            for k in range(RECREATED_MESSAGES):
                doc.send("Recreated", {"doc": doc_id, "k": k}, destination=DESTINATION)
    _, found = store.read([doc_id])
    row = found[doc_id]
    commands = commands_for(
        store.table_id, run.settings.table_uri, [(row.id, row.last_seq, row.incarnation)]
    )
    run.queue.send(run.command_queue, [c.to_queue_message() for c in commands])

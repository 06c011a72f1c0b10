"""The supervisor's deletes through the library (``uow.delete``), after the first drain, where
nothing else writes: each step's outcome is forced by what it does, not left to timing.

- **Deleted with a last message, kept deleted.** A fully dispatched document is deleted with a
  last message (``Deleted``) by a unit of work without a dispatcher, so its tombstone's last
  message is surely not sent. A create of the id right then must be refused (a create over an
  unsent tombstone); a fold of every bucket (``outbox maintain``'s, at any share) must keep the
  tombstone and its life's rows; a ``ProcessDocument`` command hands the tombstone to the
  workers, and the second drain must deliver its last message. Its tombstone is still in the
  table when the seed is verified (no fold runs after the writers), so a reader that shows
  tombstones returns it, and a fold that removes an unsent tombstone loses its last message (I1).
- **Deleted without one, then a new life.** Another dispatched document is deleted with no
  message (its tombstone is sent at once) and created again with a message: a new life (the
  tombstone's version + 1, a new incarnation), delivered by the second drain.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from outbox.app.checker.execute import PASS_EVERY, Run, drain_step
from outbox.app.checker.procs import DESTINATION

FOLD_ATTEMPTS = 5  # a fold skipped for a concurrent commit is tried again this often

KEPT = "delete through the library with a last message, a create over its tombstone refused"
REBORN = "delete through the library, then a new life over the sent tombstone"


def delete_through_the_library(run: Run, broken: Any, *, wait: float) -> None:
    """Both steps on two fully dispatched documents (waiting for them up to ``wait`` seconds,
    the drain's steps going on); sets ``run.kept_deleted`` and ``run.reborn``. A seed that
    committed nothing goes without them (the report names them unfired)."""
    deadline = time.monotonic() + wait
    while True:
        candidates, committed = _dispatched(run)
        if len(candidates) >= 2 or not committed or time.monotonic() >= deadline:
            break
        drain_step(run)  # the workers and the rescuer go on meanwhile
        time.sleep(PASS_EVERY)
    writes = broken.supervisor_writes() if broken else contextlib.nullcontext()
    with writes:
        for doc_id in candidates:
            if run.kept_deleted is None:
                if _delete_and_keep(run, doc_id):
                    run.kept_deleted = doc_id
            elif run.reborn is None and _delete_and_reborn(run, doc_id):
                run.reborn = doc_id
                break
    if run.kept_deleted is None and run.reborn is None:
        run.say("no dispatched document to delete: the library delete steps did not run")
        return
    run.report.drained = False
    run.say(f"deleted {run.kept_deleted!r} and {run.reborn!r} through the library")


def _dispatched(run: Run) -> tuple[list[str], int]:
    """(live documents whose messages were all sent, other than the re-created one; how many
    documents have committed messages at all), read from the table."""
    from deltalake import DeltaTable

    from outbox.delta.current import current_rows

    settings = run.settings
    table = DeltaTable(settings.table_uri, storage_options=settings.storage_options or None)
    columns = ["id", "version", "last_seq", "dispatched_seq", "incarnation", "deleted"]
    rows = current_rows(table.to_pyarrow_table(columns=columns)).to_pylist()
    committed = [r for r in rows if r["last_seq"] > 0]
    done = [
        r["id"]
        for r in committed
        if r["dispatched_seq"] == r["last_seq"] and not r["deleted"] and r["id"] != run.recreated
    ]
    return sorted(done), len(committed)


def _uow(run: Run) -> Any:
    from outbox.core.clock import SystemClock
    from outbox.unit_of_work import UnitOfWork

    run.store.refresh()
    return UnitOfWork(run.store, run.settings, SystemClock())


def _delete_and_keep(run: Run, doc_id: str) -> bool:
    from outbox.core.errors import ConcurrencyError

    try:
        with _uow(run) as uow:
            doc = uow.get(doc_id)
            if doc is None:
                uow.discard()
                return False
            doc.send("Deleted", {"doc": doc_id, "last": True}, destination=DESTINATION)
            uow.delete(doc)
    except ConcurrencyError:
        return False
    try:
        with _uow(run) as uow:
            uow.create(doc_id, type="package").send(
                "Recreated", {"doc": doc_id, "too_early": True}, destination=DESTINATION
            )
        run.report.delete_violations.append(
            f"{doc_id!r}: a create over its tombstone, whose last message was not sent, committed"
        )
    except ConcurrencyError:
        run.report.creates_refused += 1  # as the rules say
    _fold(run, doc_id)
    _command(run, doc_id)
    return True


def _fold(run: Run, doc_id: str) -> None:
    """Fold every bucket with anything to fold (``outbox maintain`` may run at any time), again
    while the tombstone's bucket is skipped for a concurrent commit."""
    from outbox.delta.fold import fold_table

    bucket = run.store.bucket(doc_id)
    for _ in range(FOLD_ATTEMPTS):
        if bucket not in fold_table(run.store, at=0).skipped:
            return


def _delete_and_reborn(run: Run, doc_id: str) -> bool:
    from outbox.core.errors import ConcurrencyError

    try:
        with _uow(run) as uow:
            if uow.get(doc_id) is None:
                uow.discard()
                return False
            uow.delete(doc_id)
    except ConcurrencyError:
        return False
    try:
        with _uow(run) as uow:
            doc = uow.create(doc_id, type="package")
            doc.state["reborn"] = True
            doc.send("Reborn", {"doc": doc_id}, destination=DESTINATION)
    except ConcurrencyError as e:
        run.report.delete_violations.append(
            f"{doc_id!r}: a create over its sent tombstone was refused ({e})"
        )
        return True
    _command(run, doc_id)
    return True


def _command(run: Run, doc_id: str) -> None:
    """A ``ProcessDocument`` command for the document (its tombstone included) to the workers;
    none when it has no row any more."""
    from dispatcher.commands import commands_for

    _, found = run.store.read([doc_id])
    row = found.get(doc_id)
    if row is None:
        return
    commands = commands_for(
        run.store.table_id, run.settings.table_uri, [(row.id, row.last_seq, row.incarnation)]
    )
    run.queue.send(run.command_queue, [c.to_queue_message() for c in commands])

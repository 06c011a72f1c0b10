"""A writer's deletes through the library (``uow.delete``), as the seed's plan places them
(``scenario.DeletePlan``), and the re-create that may follow.

What they exercise, under the same crashes, kills and outages as the saves: a tombstone racing
saves (the ``raced`` kind forces a save between the delete's read and its commit, so the delete
loses and is retried; the other writers race it on the shared documents by themselves), a
delete's last messages (``last``: the round's own messages, committed with the delete), and a
create over the tombstone, refused while its last messages are not sent (the writer waits for the
dispatcher, a worker or the rescuer to send them, as an application retrying would) and a new
life once they are. The verdict is not taken from here: the table's change data feed says what
was committed (``truth``), and the journal only counts refusals and lost races.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.app.checker.scenario import DeletePlan

DESTINATION = "shipments"
OCC_ATTEMPTS = 20  # a delete or re-create that loses this many races in a row gives up
REFUSED_WAIT_LIMIT = 60.0  # a create refused over an unsent tombstone retries this long
REFUSED_PAUSE = 0.05  # between two attempts of a refused create


def plan_for(cfg: dict[str, Any], round_index: int) -> DeletePlan | None:
    """The delete planned after round ``round_index`` of this writer, if any."""
    from outbox.app.checker.scenario import DeletePlan

    for d in cfg.get("deletes", ()):
        plan = d if isinstance(d, DeletePlan) else DeletePlan(**d)
        if plan.round == round_index:
            return plan
    return None


def refused(error: Exception) -> bool:
    """A create refused over a tombstone whose last messages are not sent (at the create, or
    at the commit: ``TombstoneNotSentError``), rather than a save that lost a race."""
    from outbox.core.errors import TombstoneNotSentError

    return isinstance(error, TombstoneNotSentError) or "last messages are not sent" in str(error)


def target(plan: DeletePlan, ids: list[str]) -> str:
    return ids[plan.pick % len(ids)]


def in_round(uow: Any, plan: DeletePlan | None, ids: list[str], existed: set[str]) -> bool:
    """A ``last`` delete inside the round's own unit of work, after its messages: only of a
    document that existed before it (one the round creates is deleted after the save instead).
    True when the delete was made here."""
    if plan is None or plan.kind != "last":
        return False
    doc_id = target(plan, ids)
    if doc_id not in existed:
        return False
    uow.delete(doc_id)
    return True


def after_round(writer: Any, plan: DeletePlan, ids: list[str], *, done: bool) -> dict[str, Any]:
    """The rest of the planned delete once the round saved: the delete itself unless the round's
    unit of work made it (``done``), then the re-create. Returns what the journal keeps."""
    from outbox.core.errors import ConcurrencyError, DocumentNotFoundError
    from outbox.testing.crash_points import InjectedCrash

    doc_id = target(plan, ids)
    out: dict[str, Any] = {"doc": doc_id, "kind": plan.kind, "conflicts": 0, "refused": 0}
    out["deleted"] = done
    try:
        for attempt in range(OCC_ATTEMPTS):
            if out["deleted"]:
                break
            try:
                out["deleted"] = _delete(writer, doc_id, race=plan.kind == "raced" and attempt == 0)
            except ConcurrencyError:
                out["conflicts"] += 1  # a save (the race, or another writer's) came first
            except DocumentNotFoundError:
                out["skipped"] = "gone"  # another writer deleted it first
                return out
            if out["deleted"] is None:
                out["skipped"], out["deleted"] = "absent", False
                return out
        if out["deleted"] and plan.recreate:
            _recreate(writer, doc_id, out)
    except InjectedCrash as e:
        # the commit happened, then the dispatcher "died": restart the application, as a round
        writer.reopen()
        out["crash"] = e.point
    return out


def _delete(writer: Any, doc_id: str, *, race: bool) -> bool | None:
    """One attempt: True once deleted, None when the document is not there."""
    with writer.ob.unit_of_work() as uow:
        if uow.get(doc_id) is None:
            uow.discard()
            return None
        if race:
            _save_between(writer, doc_id)
        uow.delete(doc_id)
    return True


def _save_between(writer: Any, doc_id: str) -> None:
    """Another unit of work saves a message on the document now, between the delete's read and
    its commit: the delete then loses the race (``ConcurrencyError``) and is retried, and the
    retried tombstone carries the message if it is not sent by then."""
    from outbox.core.errors import ConcurrencyError

    try:
        with writer.ob.unit_of_work() as other:
            doc = other.get(doc_id)
            if doc is None:
                other.discard()
                return
            body = {"doc": doc_id, "writer": writer.cfg["index"], "racing": True}
            doc.send("Racing", body, destination=DESTINATION)
    except ConcurrencyError:
        pass  # a third writer came first: the delete loses all the same


def _recreate(writer: Any, doc_id: str, out: dict[str, Any]) -> None:
    """Create the id again with a message: refused (``ConcurrencyError``) while the tombstone's
    last messages are not sent, then a new life. Another writer that created it first ends
    the attempt (``out["recreated"]`` False)."""
    from outbox.core.errors import ConcurrencyError

    deadline = time.monotonic() + REFUSED_WAIT_LIMIT
    races = 0
    while True:
        try:
            with writer.ob.unit_of_work() as uow:
                if uow.get(doc_id) is not None:  # someone created it again first
                    uow.discard()
                    out["recreated"] = False
                    return
                doc = uow.create(doc_id, type="package")
                body = {"doc": doc_id, "writer": writer.cfg["index"], "recreated": True}
                doc.send("Recreated", body, destination=DESTINATION)
            out["recreated"] = True
            return
        except ConcurrencyError as e:
            if refused(e):
                out["refused"] += 1  # the tombstone's last messages are still pending
            else:
                races += 1
            if time.monotonic() >= deadline or races >= OCC_ATTEMPTS:
                out["recreated"], out["gave_up"] = False, str(e)[:200]
                return
            time.sleep(REFUSED_PAUSE)

"""Writing documents with messages, and reading back what a run delivered."""

from __future__ import annotations

from outbox.app.facade import Outbox
from outbox.core.model import OutboxMessage


def write_docs(
    ob: Outbox,
    committed: dict[str, list[OutboxMessage]],
    n_docs: int,
    n_msgs: int,
    *,
    prefix: str = "pkg",
    destination: str | None = None,
) -> None:
    """One unit of work creating (or extending) ``n_docs`` documents with ``n_msgs`` messages each.

    ``committed`` is filled *before* the commit returns, so a test that crashes after the commit
    still knows what was committed.
    """
    new: dict[str, list[OutboxMessage]] = {}
    with ob.unit_of_work() as uow:
        ids = [f"{prefix}{i}" for i in range(n_docs)]
        existing = uow.get_many(ids)
        for doc_id in ids:
            doc = existing.get(doc_id) or uow.create(doc_id, type="package")
            doc.state["n"] = doc.state.get("n", 0) + n_msgs
            new[doc_id] = [
                doc.send("StatusChanged", {"doc": doc_id, "k": k}, destination=destination)
                for k in range(n_msgs)
            ]
        for doc_id, msgs in new.items():
            committed.setdefault(doc_id, []).extend(msgs)

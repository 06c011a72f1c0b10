"""Workspaces the CLI tests start from."""

from __future__ import annotations

from pathlib import Path

from outbox import Outbox


def dispatched_workspace(path: Path) -> Path:
    """A migrated workspace at ``path`` holding one committed, dispatched document (``pkg-1``,
    its message sent to the in-memory transport)."""
    with (
        Outbox.open(path, transport="memory", default_destination="shipments") as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("pkg-1", type="Package").send("Left", {"at": "Seattle"})
    return path

"""Open the checkpoint store the settings name: ``sql`` or ``cosmos``.

Why one factory: ``outbox rescue``, ``outbox status`` and the log-trim/vacuum guard must all read
the same checkpoints, or a trim could cut history a rescuer still needs. It lives beside (not in)
``rescuer.checkpoint`` because the Cosmos store imports that module's ``Checkpoint``.
"""

from __future__ import annotations

from typing import Protocol

from outbox.core.settings import Settings
from rescuer.checkpoint import CheckpointStore, SqlCheckpointStore


class ClosableCheckpointStore(CheckpointStore, Protocol):
    """A store its opener must close (both shipped stores hold connections)."""

    def close(self) -> None: ...


def checkpoint_store_from_settings(settings: Settings) -> ClosableCheckpointStore:
    """``outbox_checkpoints`` in ``sql_url`` (``checkpoint_store = "sql"``, the default), or the
    ``cosmos_checkpoint_container`` (``checkpoint_store = "cosmos"``, docs/cosmos.md)."""
    if settings.checkpoint_store == "cosmos":
        from rescuer.checkpoint_cosmos import CosmosCheckpointStore

        return CosmosCheckpointStore.from_settings(settings)
    return SqlCheckpointStore(settings.sql_url)

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.settings import Settings
from outbox.delta.store import DeltaDocumentStore


def bare_outbox(ws: Path, clock: ManualClock | None = None, **overrides: object) -> Outbox:
    """An Outbox over a fresh table with no dispatcher wired: the write path alone."""
    settings = Settings(workspace=ws, **overrides)  # type: ignore[arg-type]
    ws.mkdir(parents=True, exist_ok=True)
    DeltaDocumentStore.create(settings.table_uri, buckets=settings.buckets)
    store = DeltaDocumentStore(settings.table_uri, clock=clock or ManualClock())
    return Outbox(settings, store, clock=clock or ManualClock())


@pytest.fixture
def ob(workspace: Path, clock: ManualClock) -> Iterator[Outbox]:
    o = bare_outbox(workspace, clock)
    yield o
    o.close()

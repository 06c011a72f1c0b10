"""The store's deltalake handle: opened afresh every ``REOPEN_EVERY`` versions, and refreshed
only when a stat shows a newer commit. Why both: a deltalake 1.6.6 handle replays the log from
the checkpoint it was opened at on every refresh and commit, and a refresh lists the whole log
(docs/delta.md, "A handle's cost over a long run")."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.delta import handle as handle_module
from outbox.delta.store import DeltaDocumentStore
from outbox.testing.tables import Table


def test_a_long_lived_handle_is_reopened_from_the_newest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handle_module, "REOPEN_EVERY", 3)
    table = Table(tmp_path / "t")
    first = table.store.delta_table
    table.put(("a", 1))
    table.put(("b", 1))
    table.store.refresh()
    assert table.store.delta_table is first  # two versions on: kept
    table.put(("c", 1))
    table.put(("d", 1))
    table.store.refresh()
    assert table.store.delta_table is not first  # past REOPEN_EVERY: a fresh handle
    assert table.store.version() == 4


def test_a_current_handle_is_not_refreshed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table(tmp_path / "t")
    store: DeltaDocumentStore = table.store
    calls: list[int] = []
    real = type(store.delta_table).update_incremental
    monkeypatch.setattr(
        type(store.delta_table),
        "update_incremental",
        lambda self: (calls.append(1), real(self))[1],
    )
    store.refresh()
    assert calls == []  # nothing newer: the stat answered
    Table(tmp_path / "t").put(("a", 1))  # another writer
    store.refresh()
    assert calls == [1]
    assert store.version() == 1

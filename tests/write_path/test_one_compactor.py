"""One compactor per table at a time: deltalake 1.6.6 committed two concurrent OPTIMIZEs of the
same version (the checker's seed 47), and every compacted row then existed twice."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

import pytest

from outbox.app.facade import Outbox
from outbox.app.maintenance import AutoCompactor, compact
from outbox.core.errors import StoreError


def test_a_compaction_while_another_process_compacts_is_skipped(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "ws", transport="memory", default_destination="d") as ob:
        for i in range(3):
            with ob.unit_of_work() as uow:
                uow.create(f"doc-{i}", type="Shipment", state={"i": i})
        lock = Path(ob.store.uri) / "_outbox_compact.lock"
        with open(lock, "a+b") as held:  # what another process's compaction holds
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert compact(ob.store) == {"skipped": "another process is compacting"}
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
        done = compact(ob.store)
        assert "skipped" not in done
        _, rows = ob.store.read([f"doc-{i}" for i in range(3)])
        assert sorted(rows) == ["doc-0", "doc-1", "doc-2"]


def _stale_handle_compacted_elsewhere(ob: Outbox) -> None:
    """Another machine's compaction commits while this store's handle still reads the old
    version: what two `outbox maintain` jobs on an object store (no shared lock) can do."""
    from deltalake import DeltaTable

    DeltaTable(ob.store.uri).optimize.compact()


def test_a_second_compaction_of_the_same_version_is_reported_not_left_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Outbox.open(tmp_path / "ws", transport="memory", default_destination="d") as ob:
        for i in range(40):  # several files in some bucket: something to compact
            with ob.unit_of_work() as uow:
                uow.create(f"doc-{i}", type="Shipment", state={"i": i})
        monkeypatch.setattr(ob.store, "_log_dir", None)  # as on abfss:// or s3://: no lock
        monkeypatch.setattr(ob.store, "refresh", ob.store.version)  # stays stale
        _stale_handle_compacted_elsewhere(ob)
        nobody_else = contextlib.nullcontext(None)  # a lease another database did not see
        with pytest.raises(StoreError, match="already removed: the rows they held now exist"):
            compact(ob.store, lease=nobody_else)


def test_writers_on_an_object_store_fold_but_never_compact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.core.errors import ConfigurationError

    with Outbox.open(tmp_path / "ws", transport="memory", default_destination="d") as ob:
        monkeypatch.setattr(ob.store, "_log_dir", None)
        compactions: list[object] = []
        real = compact

        def counted(store: object, **kw: object) -> object:
            compactions.append(store)
            return real(store, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr("outbox.app.maintenance.compact", counted)
        auto = AutoCompactor(ob.store, every=1)
        for v in range(1, 5):
            auto(None, v)
        assert auto.runs == 4  # it folds
        assert compactions == []  # but never compacts
        with pytest.raises(ConfigurationError, match="maintenance lease"):
            real(ob.store)  # and a compaction without the lease is refused
        monkeypatch.undo()
        local = AutoCompactor(ob.store, every=1)
        local(None, ob.store.version() + 1)
        assert local.runs == 1

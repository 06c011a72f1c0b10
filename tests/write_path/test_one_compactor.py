"""One compactor per table at a time: deltalake 1.6.6 committed two concurrent OPTIMIZEs of the
same version (the checker's seed 47), and every compacted row then existed twice."""

from __future__ import annotations

import fcntl
from pathlib import Path

from outbox.app import Outbox
from outbox.maintenance import compact


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

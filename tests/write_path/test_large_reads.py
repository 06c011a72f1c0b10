"""Reads of many documents at once: a unit of work with tens of thousands of documents re-reads
them all before its commit (``_recheck``), and a Spark apply's dispatch reads as many.

Found by the 100,000-message Spark benchmark's Python twin: one ``id IN (...)`` of 100,000
literals overflowed DataFusion's stack and the process died with SIGSEGV (40,000 was enough;
20,000 was not). The store now reads ``SCAN_CHUNK`` ids per query; with one query this test
kills the test process, which fails the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.app.facade import Outbox
from outbox.delta import store as delta_store


def test_a_read_of_40000_ids_is_chunked_and_finds_what_exists(tmp_path: Path) -> None:
    assert delta_store.SCAN_CHUNK < 20_000  # below the size that crashed
    with Outbox.open(tmp_path / "ws", transport="memory", default_destination="d") as ob:
        with ob.unit_of_work() as uow:
            for i in range(3):
                uow.create(f"doc-{i}", type="Shipment", state={"i": i}).send("Created", {"i": i})
        ids = [f"missing-{i}" for i in range(40_000)] + ["doc-0", "doc-2"]
        _, rows = ob.store.read(ids)
        assert sorted(rows) == ["doc-0", "doc-2"]


def test_chunks_are_stitched_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_store, "SCAN_CHUNK", 2)
    with Outbox.open(tmp_path / "ws", transport="memory", default_destination="d") as ob:
        with ob.unit_of_work() as uow:
            for i in range(7):
                uow.create(f"doc-{i}", type="Shipment", state={"i": i})
        _, rows = ob.store.read([f"doc-{i}" for i in range(7)])
        assert sorted(rows) == [f"doc-{i}" for i in range(7)]
        with ob.unit_of_work() as uow:  # the re-check before a commit reads in chunks too
            for i in range(7):
                doc = uow.get(f"doc-{i}")
                assert doc is not None
                doc.send("Seen", {"i": i})
        assert ob.store.scan_pending().num_rows == 0  # all 7 committed and dispatched

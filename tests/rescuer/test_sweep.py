"""The local sweep reads through DataFusion, like ``DeltaDocumentStore.scan_pending``."""

from __future__ import annotations

from typing import Any

import pytest

from rescuer.cdf_local import LocalEngine
from rescuer.planner import PendingDocument
from tests.rescuer.conftest import Table


def test_sweep_with_a_delta_checkpoint_matches_the_store(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a checkpoint, file statistics come back as ``string_view`` (docs/delta.md); the
    sweep must not go through ``to_pyarrow_table(filters=...)``, which breaks on them and does
    not prune partitions."""
    from deltalake import DeltaTable

    table.put(*((f"d{i:02d}", 1) for i in range(12)))
    table.dispatch(**{f"d{i:02d}": 1 for i in range(0, 12, 3)})
    table.put(("d01", 4), ("zz", 2))
    table.store.delta_table.create_checkpoint()
    latest = table.put(("late", 1))
    assert list(_log(table).glob("*.checkpoint.parquet"))

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the sweep must read through DataFusion, not to_pyarrow_table")

    monkeypatch.setattr(DeltaTable, "to_pyarrow_table", refuse)
    plan = LocalEngine().plan_sweep(table.uri, latest)
    expected = table.store.scan_pending(columns=["id", "last_seq", "dispatched_seq"])
    assert {(p.id, p.last_seq, p.dispatched_seq) for p in plan.pending} == {
        (r["id"], r["last_seq"], r["dispatched_seq"]) for r in expected.to_pylist()
    }
    assert PendingDocument("d01", 4, 0) in plan.pending
    assert PendingDocument("d03", 1, 1) not in plan.pending
    assert len(plan.pending) == 10  # 12 - 4 dispatched + d01 (already pending) + zz + late


def test_sweep_reads_the_pass_snapshot_when_the_table_moved(table: Table) -> None:
    engine = LocalEngine()
    before = table.put(("a", 1))
    engine.plan_sweep(table.uri, before)  # caches the handle at ``before``
    table.put(("b", 1))
    at_before = engine.plan_sweep(table.uri, before)
    assert [p.id for p in at_before.pending] == ["a"]
    now = engine.plan_sweep(table.uri, table.store.refresh())
    assert [p.id for p in now.pending] == ["a", "b"]


def _log(table: Table) -> Any:
    from pathlib import Path

    return Path(table.uri) / "_delta_log"

"""A table whose rows exist twice (two compactions of one version, issue 32): found by `outbox
maintain`, refused by saves before they commit, repaired by `outbox maintain --repair`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main as cli_main
from outbox.app.facade import Outbox
from outbox.core.errors import DuplicateRowsError
from outbox.delta.repair import find_duplicates


def _damaged(ws: Path, docs: int = 40) -> Outbox:
    """Two handles compact the same version: deltalake commits both, and every row they both
    rewrote exists twice (what two `outbox maintain` on an object store did before the lease)."""
    from deltalake import DeltaTable

    ob = Outbox.open(ws, transport="memory", default_destination="d", compact_every=0)
    for i in range(docs):
        with ob.unit_of_work() as uow:
            uow.create(f"doc-{i}", type="Shipment", state={"i": i}).send("E", {"i": i})
    first, second = DeltaTable(ob.store.uri), DeltaTable(ob.store.uri)
    first.optimize.compact()
    second.optimize.compact()
    return ob


def test_a_double_compaction_is_found_refused_and_repaired(workspace: Path) -> None:
    ob = _damaged(workspace)
    try:
        found = find_duplicates(ob.store)
        assert found.pairs == 40
        before = {d: r.state for d, r in ob.store.read([f"doc-{i}" for i in range(40)])[1].items()}
        assert len(before) == 40  # the copies are equal: the documents still read right
        version = ob.store.refresh()
        uow = ob.unit_of_work()
        doc = uow.get("doc-3")
        assert doc is not None
        doc.state["x"] = 1
        with pytest.raises(DuplicateRowsError, match="maintain --repair"):
            uow.commit()
        assert ob.store.refresh() == version  # refused before the commit

        runner = CliRunner()
        env = {"OUTBOX_WORKSPACE": str(workspace)}
        plain = runner.invoke(cli_main, ["maintain", "--json"], env=env)
        assert plain.exit_code == 0, plain.output
        assert json.loads(plain.stdout)["duplicates"]["duplicated_versions"] == 40
        fixed = runner.invoke(cli_main, ["maintain", "--repair", "--json"], env=env)
        assert fixed.exit_code == 0, fixed.output
        report = json.loads(fixed.stdout)["duplicates"]
        assert report["rows_removed"] == 40
        assert find_duplicates(ob.store).pairs == 0
        after = {d: r.state for d, r in ob.store.read([f"doc-{i}" for i in range(40)])[1].items()}
        assert after == before
        with ob.unit_of_work() as uow:  # and saves work again
            doc = uow.get("doc-3")
            assert doc is not None
            doc.state["x"] = 1
    finally:
        ob.close()

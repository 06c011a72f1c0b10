"""The soak's trial run (``python -m benchmarks.checker_soak --quick``) never replaces the committed
soak in ``benchmarks/results/checker_soak.json`` (issue 42: the soak was to be tried on a few
seeds before the 1,000-seed run, and a run of a few seeds used to write the committed file)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks import checker_soak
from benchmarks.common import RESULTS
from outbox.app.checker.report import CheckReport, results_document


def test_a_quick_soak_writes_beside_the_committed_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = RESULTS / "checker_soak.json"
    before = committed.read_bytes()
    # what one chunk of 8 seeds left (``--merge-only`` merges it without running a seed)
    reports = [
        CheckReport(seed, "unit", drained=True, committed=1, invariants={"I1 no loss": True})
        for seed in range(1001, 1009)
    ]
    (tmp_path / "chunk-1001.json").write_text(json.dumps(results_document(reports, {})))
    (tmp_path / "soak-meta.json").write_text(json.dumps({"commit": "x", "started": time.time()}))
    args = ["--quick", "--merge-only", "--workdir", str(tmp_path), "--chunks", "1"]
    assert checker_soak.main(args) == 0
    assert committed.read_bytes() == before
    written = Path(capsys.readouterr().err.rsplit("wrote ", 1)[1].strip())
    assert written.name == "checker_soak.quick.json"
    assert not written.resolve().is_relative_to(RESULTS.resolve())
    merged = json.loads(written.read_text())
    assert (merged["quick"], merged["seeds_run"], merged["partial"]) == (True, 8, False)

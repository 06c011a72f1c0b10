"""The Grafana dashboard is built only on metric names docs/observability.md documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_uses_documented_metrics_only() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_bucket$", "", n) for e in exprs for n in re.findall(r"outbox_[a-z_]+", e)}
    documented = set(
        re.findall(r"outbox_[a-z_]+", (ROOT / "docs" / "observability.md").read_text())
    )
    assert len(used) >= 10
    assert used <= documented, sorted(used - documented)

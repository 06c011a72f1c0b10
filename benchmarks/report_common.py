"""What every results renderer (``benchmarks.report`` and its parts) shares: where the results
are, how a figure and a table are printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return data


def n(value: float, digits: int = 0) -> str:
    """A figure as the docs print it: thousands separators, fixed decimals."""
    return f"{value:,.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def sig(value: float) -> str:
    """Two significant figures for latencies that span 3 ms to 60 ms."""
    return n(value, 1) if value < 10 else n(value)


def slash(values: list[str]) -> str:
    """Figures of one row's cases, as the docs print them: ``1 / 100 / 1,000``."""
    return " / ".join(values)

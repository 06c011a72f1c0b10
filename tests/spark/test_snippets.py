"""The Spark snippets of docs/spark.md (```python) and the ```python spark blocks of the README
and the user guide run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


def blocks() -> list[tuple[str, str]]:
    found = [
        ("docs/spark.md", b)
        for b in re.findall(r"```python\n(.*?)```", (REPO / "docs" / "spark.md").read_text(), re.S)
    ]
    for page in ("README.md", "docs/guide.md"):
        found += [
            (page, b)
            for b in re.findall(r"```python spark\n(.*?)```", (REPO / page).read_text(), re.S)
        ]
    return found


def test_spark_snippets_run(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("OUTBOX_")]:
        if name != "OUTBOX_DELTA_JARS":
            monkeypatch.delenv(name)
    found = blocks()
    assert found, "docs/spark.md has no python block"
    for i, (where, block) in enumerate(found):
        namespace: dict[str, object] = {"__name__": "snippet", "spark": spark}
        try:
            exec(compile(block, f"{where} spark block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{where} spark block {i + 1} failed: {type(e).__name__}: {e}\n{block}")
    assert (tmp_path / ".outbox" / "documents" / "_delta_log").is_dir()

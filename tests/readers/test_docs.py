"""docs/readers.md follows the code: its Python blocks run (in order, one namespace), its view is
the text the code generates, and the pages that used to hold a hand-written query point to it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from outbox.delta import current

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "readers.md"


def test_the_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "readers"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/readers.md python block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"docs/readers.md python block {i + 1} failed: {type(e).__name__}: {e}")


def test_the_view_on_the_page_is_the_generated_query() -> None:
    [block] = re.findall(r"```sql\n(.*?)```", PAGE.read_text(), flags=re.S)
    query = current.current_sql("delta.`/lake/outbox/documents`")
    assert block == f"CREATE OR REPLACE VIEW documents_current AS\n{query}\n"


def test_the_guide_links_the_page_and_table_md_no_longer_holds_a_query_of_its_own() -> None:
    assert "(readers.md)" in (ROOT / "docs" / "guide.md").read_text()
    table = (ROOT / "docs" / "table.md").read_text()
    assert "(readers.md)" in table
    assert "row_number()" not in table

"""The Python blocks of README.md and the user guide run, in order, in one namespace per page
(executable documentation).

A ```python block runs here; a ```python spark block needs a SparkSession and runs in
tests/spark/test_snippets.py instead. Shell, TOML and text blocks are documentation only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The pages whose ```python blocks run here (each in its own folder and namespace).
PAGES = (README, ROOT / "docs" / "guide.md")


def python_blocks(page: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_has_python_blocks(page: Path) -> None:
    assert len(python_blocks(page)) >= 3  # the tour: write, receive and settle, the consumer


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_python_blocks_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    where = page.relative_to(ROOT)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(python_blocks(page)):
        try:
            exec(compile(block, f"{where} python block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{where} python block {i + 1} failed: {type(e).__name__}: {e}\n{block}")
    assert (tmp_path / ".outbox" / "documents" / "_delta_log").is_dir()


def test_readme_commands_match_ci() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci
    assert "./scripts/test.sh" in README.read_text()


def test_readme_is_short_and_has_a_table_of_contents() -> None:
    """Issue 43: a README a newcomer reads in ten minutes; the rest is in docs/guide.md."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    assert "## Contents" in lines


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_lead_to_files() -> None:
    """README links into docs/ as ``docs/x.md``, a docs page to another as ``x.md``: every such
    target exists (the guide moved most of the README's text; a stale link is easy to leave)."""
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for target in _LINK.findall(line):
                path = target.split("#")[0]
                if not path or "://" in target or target.startswith("mailto:"):
                    continue
                if not (page.parent / path).exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []

"""The README's Python blocks run, in order, in one namespace (executable documentation)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks() -> None:
    assert len(python_blocks()) >= 4


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(__import__("os").environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"README python block {i + 1} failed: {type(e).__name__}: {e}\n{block}")
    assert (tmp_path / ".outbox" / "documents" / "_delta_log").is_dir()


def test_readme_commands_match_ci() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in ci
    assert "./scripts/test.sh" in README.read_text()

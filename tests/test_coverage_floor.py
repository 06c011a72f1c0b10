"""The coverage floor (``fail_under`` in pyproject.toml) may only rise.

CI measures coverage of the shipped packages over the whole suite (scripts/test.sh) and fails
below the floor; this test reads the floor's history in git, so lowering it fails too: a change
that loses tests must say so by failing, not by moving the bar."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOOR = re.compile(r"^([+-])fail_under\s*=\s*([0-9.]+)", re.M)


def floors_in_history(log: str) -> list[float]:
    """Each value the floor was set to, oldest first, from ``git log -p`` of pyproject.toml."""
    values: list[float] = []
    for commit in reversed(log.split("\ncommit ")):  # git log is newest first
        values += [float(v) for sign, v in FLOOR.findall(commit) if sign == "+"]
    return values


def current_floor() -> float:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return float(config["tool"]["coverage"]["report"]["fail_under"])


def test_the_floor_never_went_down() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the floor's history is read from git: run the suite in a clone")
    log = subprocess.run(
        ["git", "log", "-p", "--format=commit %H", "--", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    values = floors_in_history(log)
    assert values, "no fail_under in pyproject.toml's history"
    assert values == sorted(values), f"the coverage floor went down: {values}"
    assert current_floor() >= values[-1], "the floor in pyproject.toml is below its last commit"


def test_a_lowered_floor_is_seen() -> None:
    """The check above can fail: a history that lowers the floor reads as lowered."""
    log = "commit b\n-fail_under = 70\n+fail_under = 60\n\ncommit a\n+fail_under = 70\n"
    values = floors_in_history(log)
    assert values == [70.0, 60.0]
    assert values != sorted(values)


def test_the_floor_is_what_scripts_test_sh_enforces() -> None:
    """The full run measures the shipped packages and fails below the floor (pytest-cov reads
    ``fail_under`` from this configuration when no ``--cov-fail-under`` is given)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(config["tool"]["coverage"]["run"]["source_pkgs"]) == set(
        config["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
    )
    script = (ROOT / "scripts" / "test.sh").read_text()
    full_run = script.rsplit("\n.venv/bin/pytest", 1)[1]
    assert "--cov " in full_run
    assert "--cov-fail-under" not in script
    assert current_floor() > 0

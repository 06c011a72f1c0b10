"""The fast lane leaves out what is heavy and keeps the rest: pinned on real collections, so a
rule that stopped choosing (everything in, or everything out) fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _collected(*args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        # the outer run's PYTEST_ADDOPTS (``-v``, a JUnit file) would change the child's output
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line}


EXIT = "tests/write_path/test_exit.py"


FILES = (
    "tests/test_fastlane.py",  # light: stays
    "tests/spark/test_apply.py",  # a heavy folder
    "tests/console/test_browser.py",  # a heavy file
    f"{EXIT}::test_without_the_exit_hook_its_threads_outlive_shutdown",  # marked slow alone
    "tests/queue/test_processes.py",  # marked slow module-wide
)


def test_the_fast_lane_keeps_the_light_tests_and_leaves_out_the_heavy_ones() -> None:
    assert _collected(*FILES) == {f.split("::", 1)[0] for f in FILES}  # without --fast: all
    assert _collected("--fast", *FILES) == {"tests/test_fastlane.py"}

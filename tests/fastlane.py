"""The fast lane, ``scripts/test.sh --fast``: the inner loop's few minutes, not CI's whole run.

Why a deselection of the one suite and not a second suite: a new test joins the fast lane by
default and leaves it by what it costs (a JVM, a broker, a browser, child processes, marked
``slow``), so the lane cannot drift from the suite CI runs. ``.ci/run`` never passes ``--fast``.
"""

from __future__ import annotations

import pytest

#: Folders whose every test starts a JVM, a broker, an object-store server or a benchmark.
HEAVY_DIRS = (
    "tests/e2e/",
    "tests/benchmarks/",
    "tests/spark/",
    "tests/objectstore/",
    "tests/kafka/",
)
#: Single files of the same kind in otherwise light folders (the console's Chromium tests).
HEAVY_FILES = ("tests/console/test_browser.py",)
#: Marks that say a test is heavy wherever it lives.
HEAVY_MARKS = ("slow", "spark", "live")
#: Fixtures that start a heavy part in the test process.
HEAVY_FIXTURES = {"kafka", "spark", "spark_session", "spark_for_checker", "sob", "browser"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        default=False,
        help="the fast lane: leave out tests that start a JVM, a broker, a browser or child "
        "processes (marked slow); scripts/test.sh --fast passes it",
    )


def is_heavy(item: pytest.Item) -> bool:
    """Whether the fast lane leaves ``item`` out (public so a test can pin the rule)."""
    path = item.nodeid.split("::", 1)[0]
    if path.startswith(HEAVY_DIRS) or path in HEAVY_FILES:
        return True
    if any(item.get_closest_marker(mark) is not None for mark in HEAVY_MARKS):
        return True
    return bool(set(getattr(item, "fixturenames", ())) & HEAVY_FIXTURES)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("fast"):
        return
    kept = [item for item in items if not is_heavy(item)]
    dropped = [item for item in items if is_heavy(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

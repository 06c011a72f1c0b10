"""The console in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver, against ``outbox console`` started as a user starts it (a process of its own, on a
free 127.0.0.1 port, printing its token once).

Under ``CI=true`` a missing Chromium fails; elsewhere it skips (``scripts/test.sh`` installs it
through ``scripts/ensure-chromium.sh``). The screenshots in docs/ come from
``scripts/console-screenshots.sh``, which drives the same pages.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import SqlQueue
from outbox.testing.browser import (
    RunningConsole,
    by,
    chromium,
    chromium_available,
    every,
    go,
    screenshot,
    start_console,
)
from tests.console.conftest import ConsoleWorkspace


def _need_chromium() -> None:
    if chromium_available():
        return
    if os.environ.get("CI"):
        pytest.fail("Chromium is not installed; scripts/test.sh installs it (ensure-chromium.sh)")
    pytest.skip("Chromium is not installed here (scripts/ensure-chromium.sh installs it)")


def _quiet(ws: Path) -> None:
    with (ws / "outbox.toml").open("a") as settings:  # the pages show the fixture's data
        settings.write("sample_interval = 0\n")


@pytest.fixture
def console(console_ws: ConsoleWorkspace) -> Iterator[RunningConsole]:
    _need_chromium()
    _quiet(console_ws.path)
    running = start_console(console_ws.path)
    yield running
    assert running.stop() == 0


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    _need_chromium()
    driver = chromium(tmp_path / "chromium")
    try:
        yield driver
    finally:
        driver.quit()


def test_each_page_opens_in_chromium(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace, tmp_path: Path
) -> None:
    browser.get(console.url)
    assert browser.title == "Overview · outbox console"
    assert by(browser, "#pending-documents .big").text == "7"
    assert by(browser, "#lag-chart").is_displayed()
    assert [r.text for r in every(browser, "#queues tbody td:first-child")] == [
        "devices", "invoices", "shipments"
    ]  # fmt: skip
    screenshot(browser, tmp_path / "overview.png")  # a page Chromium cannot render fails here

    go(browser, "#nav-dead-letters")
    assert browser.title == "Dead letters · outbox console"
    assert by(browser, "#total").text == "4 dead letters match."
    screenshot(browser, tmp_path / "dead-letters.png")

    [newest] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    go(browser, f"#show-{newest}")
    assert by(browser, "#reason").text == "Timeout"
    assert '"order": 1' in by(browser, "#body").text
    screenshot(browser, tmp_path / "dead-letter.png")

    go(browser, "#nav-devices")
    assert [r.text for r in every(browser, "#devices tbody td:first-child")] == ["pump-1", "pump-2"]
    screenshot(browser, tmp_path / "devices.png")


def test_a_dead_letter_requeued_through_the_page_is_back_in_its_queue(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    assert console.token is not None
    browser.get(console.url + "unlock")
    by(browser, "#token").send_keys(console.token)
    go(browser, "#unlock")
    assert by(browser, "#mode").text == "unlocked"

    browser.get(console.url + "dead-letters?queue=shipments")
    [ship1] = [i for i, (_q, m) in console_ws.dead.items() if m == "ship-1"]
    by(browser, f"#select-{ship1}").click()
    go(browser, "#requeue-selected")
    assert by(browser, "#confirm-title").text == "Requeue 1 dead letter?"
    with SqlQueue(console_ws.url) as q:
        assert [m.message_id for m in q.peek("shipments", 10)] == []  # nothing before the yes
    go(browser, "#confirm")
    assert by(browser, ".flash").text == "1 dead letter requeued."

    with SqlQueue(console_ws.url) as q:
        assert [m.message_id for m in q.peek("shipments", 10)] == ["ship-1"]
        left = {d.message_id for d in q.list_dead_letters("shipments", 10)}
    assert left == {"ship-0", "ship-2"}


def test_an_action_without_the_token_is_refused_in_the_browser(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    browser.get(console.url + "dead-letters")
    assert by(browser, "#mode").text.startswith("locked")
    [inv] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    by(browser, f"#select-{inv}").click()
    go(browser, "#purge-selected")
    assert by(browser, "#error-title").text == "This action needs the console token"
    with SqlQueue(console_ws.url) as q:
        assert q.count_dead_letters(all=True) == 4


def test_a_read_only_console_offers_no_action(console_ws: ConsoleWorkspace, browser: Any) -> None:
    _quiet(console_ws.path)
    read_only = start_console(console_ws.path, "--read-only")
    try:
        assert "read-only: nothing can be changed from it" in read_only.lines
        browser.get(read_only.url + "dead-letters")
        assert by(browser, "#mode").text == "read-only"
        assert every(browser, "button[name=action]") == []
        assert every(browser, "input[type=checkbox]") == []
    finally:
        assert read_only.stop() == 0

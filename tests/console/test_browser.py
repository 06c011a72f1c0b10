"""The console in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver, against ``outbox console`` started as a user starts it (a process of its own, on a
free 127.0.0.1 port, printing its token once).

Under ``CI=true`` a missing Chromium fails; elsewhere it skips (``scripts/test.sh`` installs it
through ``scripts/ensure-chromium.sh``). ``OUTBOX_CONSOLE_SCREENSHOTS=DIR`` saves each page's
screenshot there (``scripts/console-screenshots.sh`` refreshes docs/images with it).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import SqlQueue
from tests.console.conftest import ConsoleWorkspace

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: How long the console may take to print its address (a bound on a wait, not a sleep).
START_TIMEOUT = 60.0
#: How long a page may take to replace the last one after a click (a bound, not a sleep).
NAVIGATION_TIMEOUT = 60.0


def _need_chromium() -> None:
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    if os.environ.get("CI"):
        pytest.fail("Chromium is not installed; scripts/test.sh installs it (ensure-chromium.sh)")
    pytest.skip("Chromium is not installed here (scripts/ensure-chromium.sh installs it)")


@dataclass
class RunningConsole:
    url: str
    token: str
    process: subprocess.Popen[str]
    lines: list[str]


def _start_console(ws: Path, *extra: str) -> RunningConsole:
    with (ws / "outbox.toml").open("a") as settings:  # the pages show the fixture's data
        settings.write("sample_interval = 0\n")
    outbox = str(Path(sys.executable).with_name("outbox"))
    process = subprocess.Popen(
        [outbox, "-w", str(ws), "console", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    url = token = None
    while url is None or token is None:
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            process.kill()
            pytest.fail(f"outbox console printed no address in {START_TIMEOUT:.0f}s: {seen}")
        if not line:
            pytest.fail(f"outbox console ended: {seen}")
        seen.append(line.rstrip())
        if m := re.match(r"outbox console on (http://\S+)", line):
            url = m.group(1)
        if m := re.match(r"actions need this token \(shown once\): (\S+)", line):
            token = m.group(1)
    return RunningConsole(url, token, process, seen)


@pytest.fixture
def console(console_ws: ConsoleWorkspace) -> Iterator[RunningConsole]:
    _need_chromium()
    running = _start_console(console_ws.path)
    yield running
    running.process.send_signal(signal.SIGTERM)
    assert running.process.wait(timeout=60) == 0


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    _need_chromium()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str, tmp_path: Path) -> None:
    """Every page is screenshotted (so a page Chromium cannot render fails here); kept in
    ``OUTBOX_CONSOLE_SCREENSHOTS`` when set."""
    where = Path(os.environ.get("OUTBOX_CONSOLE_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 40, 1600)))
    assert driver.save_screenshot(str(where / f"console-{name}.png"))


def _by(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def _go(driver: Any, css: str) -> None:
    """Click what navigates (a link, a submit button) and wait until the next page replaced
    this one: ``click`` returns before the browser has loaded it. A wait for a condition with a
    bound, not a sleep."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.wait import WebDriverWait

    element = _by(driver, css)
    element.click()
    WebDriverWait(driver, NAVIGATION_TIMEOUT).until(ec.staleness_of(element))


def _all(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def test_each_page_opens_in_chromium(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace, tmp_path: Path
) -> None:
    browser.get(console.url)
    assert browser.title == "Overview · outbox console"
    assert _by(browser, "#pending-documents .big").text == "7"
    assert _by(browser, "#lag-chart").is_displayed()
    assert [r.text for r in _all(browser, "#queues tbody td:first-child")] == [
        "devices", "invoices", "shipments"
    ]  # fmt: skip
    _shot(browser, "overview", tmp_path)

    _go(browser, "#nav-dead-letters")
    assert browser.title == "Dead letters · outbox console"
    assert _by(browser, "#total").text == "4 dead letters match."
    _shot(browser, "dead-letters", tmp_path)

    [newest] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    _go(browser, f"#show-{newest}")
    assert _by(browser, "#reason").text == "Timeout"
    assert '"order": 1' in _by(browser, "#body").text
    _shot(browser, "dead-letter", tmp_path)

    _go(browser, "#nav-devices")
    assert [r.text for r in _all(browser, "#devices tbody td:first-child")] == ["pump-1", "pump-2"]
    _shot(browser, "devices", tmp_path)


def test_a_dead_letter_requeued_through_the_page_is_back_in_its_queue(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace, tmp_path: Path
) -> None:
    browser.get(console.url + "unlock")
    _by(browser, "#token").send_keys(console.token)
    _go(browser, "#unlock")
    assert _by(browser, "#mode").text == "unlocked"

    browser.get(console.url + "dead-letters?queue=shipments")
    [ship1] = [i for i, (_q, m) in console_ws.dead.items() if m == "ship-1"]
    _by(browser, f"#select-{ship1}").click()
    _go(browser, "#requeue-selected")
    assert _by(browser, "#confirm-title").text == "Requeue 1 dead letter?"
    _shot(browser, "confirm", tmp_path)
    with SqlQueue(console_ws.url) as q:
        assert [m.message_id for m in q.peek("shipments", 10)] == []  # nothing before the yes
    _go(browser, "#confirm")
    assert _by(browser, ".flash").text == "1 dead letter requeued."

    with SqlQueue(console_ws.url) as q:
        assert [m.message_id for m in q.peek("shipments", 10)] == ["ship-1"]
        left = {d.message_id for d in q.list_dead_letters("shipments", 10)}
    assert left == {"ship-0", "ship-2"}


def test_an_action_without_the_token_is_refused_in_the_browser(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    browser.get(console.url + "dead-letters")
    assert _by(browser, "#mode").text.startswith("locked")
    [inv] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    _by(browser, f"#select-{inv}").click()
    _go(browser, "#purge-selected")
    assert _by(browser, "#error-title").text == "This action needs the console token"
    with SqlQueue(console_ws.url) as q:
        assert q.count_dead_letters(all=True) == 4


def test_the_token_is_printed_once_and_a_read_only_console_offers_no_action(
    console_ws: ConsoleWorkspace, browser: Any
) -> None:
    read_only = _start_console_read_only(console_ws.path)
    try:
        browser.get(read_only[0] + "dead-letters")
        assert _by(browser, "#mode").text == "read-only"
        assert _all(browser, "button[name=action]") == []
    finally:
        read_only[1].send_signal(signal.SIGTERM)
        assert read_only[1].wait(timeout=60) == 0


def _start_console_read_only(ws: Path) -> tuple[str, subprocess.Popen[str]]:
    outbox = str(Path(sys.executable).with_name("outbox"))
    process = subprocess.Popen(
        [outbox, "-w", str(ws), "console", "--port", "0", "--read-only"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    m = re.match(r"outbox console on (http://\S+)", first)
    assert m, first
    assert process.stdout.readline().strip() == "read-only: nothing can be changed from it"
    return m.group(1), process


def test_chromium_is_the_debian_one() -> None:
    """The suite drives the system browser, never a downloaded one."""
    _need_chromium()
    assert shutil.which("chromium") == CHROMIUM or Path(CHROMIUM).exists()

"""Debian's headless Chromium driven by Selenium, and ``outbox console`` run as a user runs it:
for the console's browser tests and the screenshots in docs/.

Why one place: the flags Chromium needs on a closed machine (no background networking, no
component updates: each would be refused, many at a time), the system driver instead of one
Selenium Manager would download, and reading the console's address and token from its output are
the same chore for every test and script. ``scripts/ensure-chromium.sh`` installs the packages.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: How long the console may take to print its address (a bound on a wait, not a sleep).
START_TIMEOUT = 60.0
#: How long a page may take to replace the last one after a click.
NAVIGATION_TIMEOUT = 60.0
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,900", "--force-device-scale-factor=1",
)  # fmt: skip


def chromium_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def chromium(user_data_dir: Path, *, network_log: bool = False) -> Any:
    """A headless Chromium (a Selenium ``WebDriver``); ``quit()`` it when done. With
    ``network_log``, ``get_log("performance")`` holds its network events."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    if network_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(NAVIGATION_TIMEOUT)
    return driver


def by(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def every(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def go(driver: Any, css: str) -> None:
    """Click what navigates (a link, a submit button) and wait until the next page replaced this
    one: ``click`` returns before the browser has loaded it. A wait for a condition with a
    bound, not a sleep."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    element = by(driver, css)
    element.click()

    def replaced(_driver: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            # Chromium may answer for a node of the page being replaced with "Node with given id
            # does not belong to the document" instead of a stale element: the same news
            return "does not belong to the document" in str(e)
        return False

    WebDriverWait(driver, NAVIGATION_TIMEOUT).until(replaced)


def screenshot(driver: Any, path: Path) -> None:
    """The whole page (the window grown to its height and the browser's frame, up to 1,800
    pixels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 160, 1800)))
    if not driver.save_screenshot(str(path)):
        raise RuntimeError(f"Chromium could not save a screenshot to {path}")


@dataclass
class RunningConsole:
    """``outbox console`` in a process of its own; ``stop()`` sends SIGTERM and returns its exit
    code."""

    url: str
    token: str | None
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def start_console(workspace: Path, *args: str) -> RunningConsole:
    """Start ``outbox -w WORKSPACE console --port 0 ARGS`` and read its address (and its token,
    unless ``--read-only`` or ``--token``) from what it prints."""
    outbox = str(Path(sys.executable).with_name("outbox"))
    process = subprocess.Popen(
        [outbox, "-w", str(workspace), "console", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    url: str | None = None
    token: str | None = None
    announced = False  # the line after the address: read-only, or how actions are unlocked
    while url is None or not announced:
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            process.kill()
            raise RuntimeError(
                f"outbox console printed no address in {START_TIMEOUT:.0f}s: {seen}"
            ) from None
        if not line:
            raise RuntimeError(f"outbox console ended: {seen}")
        seen.append(line.rstrip())
        if m := re.match(r"outbox console on (http://\S+)", line):
            url = m.group(1)
        if m := re.match(r"actions need this token \(shown once\): (\S+)", line):
            token = m.group(1)
        announced = announced or line.startswith(("read-only:", "actions need"))
    return RunningConsole(url, token, process, seen)

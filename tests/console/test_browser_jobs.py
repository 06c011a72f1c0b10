"""A paced requeue in Chromium (issue 46, item 3): asked for from the dead letters' confirmation
(into another queue, at a rate), it runs as a console job whose page shows its progress and
refreshes itself until it is done. The browser fixtures are in this folder's conftest."""

from __future__ import annotations

from typing import Any

from dispatcher.queue import SqlQueue
from testkit.browser import NAVIGATION_TIMEOUT, RunningConsole, by, go
from tests.console.conftest import ConsoleWorkspace
from tests.console.test_browser import _unlock_in, sqlite_only


def _state(driver: Any) -> str:
    """The job page's state, or "" while the page is being replaced by its own refresh."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("css selector", "#state").text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


@sqlite_only
def test_a_paced_requeue_into_another_queue_shows_its_progress_in_chromium(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    _unlock_in(browser, console)
    browser.get(console.url + "dead-letters?queue=shipments")
    go(browser, "#requeue-matching")
    by(browser, "#to-queue").send_keys("retry")
    by(browser, "#rate").send_keys("1000")
    go(browser, "#confirm")
    assert browser.current_url.endswith("/jobs/1")
    assert by(browser, "h1").text.startswith("Job 1")
    WebDriverWait(browser, NAVIGATION_TIMEOUT, poll_frequency=0.2).until(
        lambda d: _state(d) == "done"
    )  # the page reloads itself while the job runs; done is the last state it shows
    assert by(browser, "#done").text == "3 of 3"
    assert by(browser, "#progress").get_attribute("value") == "3"
    with SqlQueue(console_ws.url) as q:
        assert sorted(m.message_id for m in q.peek("retry", 10)) == ["ship-0", "ship-1", "ship-2"]
        assert {d.queue for d in q.list_dead_letters(None, 10)} == {"invoices"}
    browser.get(console.url + "audit")
    assert "dead-letters.requeue" in by(browser, "#audit").text

"""The console in a real browser: Debian's headless Chromium, driven by Selenium through Debian's
chromedriver, against ``outbox console`` started as a user starts it (a process of its own, on a
free 127.0.0.1 port, printing its token once).

Under ``CI=true`` a missing Chromium fails; elsewhere it skips (``scripts/test.sh`` installs it
through ``scripts/ensure-chromium.sh``). The screenshots in docs/ come from
``scripts/console-screenshots.sh``, which drives the same pages.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import SqlQueue
from testkit.browser import (
    NAVIGATION_TIMEOUT,
    RunningConsole,
    by,
    chromium,
    every,
    go,
    screenshot,
    start_console,
)
from tests.console.conftest import ConsoleWorkspace, need_chromium, quiet

#: What the browser adds does not depend on the database: the tests of the locks, the cookies,
#: the token, the read-only mode and the icon run on SQLite only; the page tour and the requeue
#: (the two that read and write the queue through the pages) run on PostgreSQL too. The test
#: client's tests of the same (test_console_app.py, test_console_session.py) run on both. Each
#: test here starts a console process; one Chromium serves the module (``browser`` clears it).
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)


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


@sqlite_only
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


@sqlite_only
def test_a_read_only_console_offers_no_action(console_ws: ConsoleWorkspace, browser: Any) -> None:
    quiet(console_ws.path)
    read_only = start_console(console_ws.path, "--read-only")
    try:
        assert "read-only: nothing can be changed from it" in read_only.lines
        browser.get(read_only.url + "dead-letters")
        assert by(browser, "#mode").text == "read-only"
        assert every(browser, "button[name=action]") == []
        assert every(browser, "input[type=checkbox]") == []
    finally:
        assert read_only.stop() == 0


# --- Lock, cookies and the icon ----------------------------------------------------------------


def _as(cookie: dict[str, Any], url: str, form: dict[str, str] | None = None) -> tuple[int, str]:
    """A request with a copy of the browser's cookie, from outside the browser (what a copied
    or stolen cookie is): the status and the page."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    request = urllib.request.Request(url, data=data)
    request.add_header("Cookie", f"{cookie['name']}={cookie['value']}")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _unlock_in(browser: Any, console: RunningConsole) -> None:
    assert console.token is not None
    browser.get(console.url + "unlock")
    by(browser, "#token").send_keys(console.token)
    go(browser, "#unlock")
    assert by(browser, "#mode").text == "unlocked"


@sqlite_only
def test_lock_in_the_browser_locks_every_copy_of_its_cookie(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    _unlock_in(browser, console)
    [cookie] = browser.get_cookies()
    status, page = _as(cookie, console.url + "dead-letters")
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert status == 200
    assert found
    [inv] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    form = {"csrf": found.group(1), "action": "purge", "scope": "selected", "id": str(inv)}
    confirm = console.url + "dead-letters/confirm"
    assert _as(cookie, confirm, form)[0] == 200  # the copy works while the browser is unlocked

    go(browser, ".lock button")  # Lock
    assert by(browser, "#mode").text.startswith("locked")
    for path in ("dead-letters/confirm", "dead-letters/apply"):
        status, page = _as(cookie, console.url + path, form)
        assert status == 403, path
        assert "This action needs the console token" in page
    with SqlQueue(console_ws.url) as q:
        assert q.count_dead_letters(all=True) == 4


@sqlite_only
def test_two_consoles_on_one_host_do_not_log_each_other_out(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    other = start_console(console_ws.path)
    try:
        _unlock_in(browser, console)
        _unlock_in(browser, other)
        browser.get(console.url)
        assert by(browser, "#mode").text == "unlocked"
        browser.get(other.url)
        assert by(browser, "#mode").text == "unlocked"
        assert len(browser.get_cookies()) == 2  # one per console, on the one host
    finally:
        assert other.stop() == 0


@sqlite_only
def test_the_first_page_load_logs_no_error_in_the_browser(
    console: RunningConsole, tmp_path: Path
) -> None:
    """The icon: without one, Chromium asked for /favicon.ico and logged its 404 as an error.
    The wait is for the icon's response itself (a bound, not a sleep)."""
    from selenium.webdriver.support.wait import WebDriverWait

    need_chromium()
    driver = chromium(tmp_path / "chromium", network_log=True)
    try:
        driver.get(console.url)
        urls: dict[str, str] = {}
        statuses: dict[str, int] = {}

        def icons() -> dict[str, int]:  # the console's (Chromium fetches icons of its own)
            ours = [u for u in statuses if u.startswith(console.url) and "favicon" in u]
            return {u: statuses[u] for u in ours}

        def icon_answered(d: Any) -> bool:
            statuses.update(_responses(d, urls))
            return bool(icons())

        WebDriverWait(driver, NAVIGATION_TIMEOUT).until(icon_answered)
        assert set(icons().values()) == {200}, icons()
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()


def _responses(driver: Any, urls: dict[str, str]) -> dict[str, int]:
    """The status of each response the browser received since the last call, by URL (``urls``
    keeps the requests' URLs by their id across calls)."""
    import json

    out: dict[str, int] = {}
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        params = event.get("params", {})
        if event["method"] == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif event["method"] == "Network.responseReceived" and params["requestId"] in urls:
            out[urls[params["requestId"]]] = int(params["response"]["status"])
    return out


# --- The trace page -----------------------------------------------------------------------------


@sqlite_only
def test_a_document_traced_from_the_header_search_in_the_browser(
    tmp_path: Path, sql_url: str, browser: Any
) -> None:
    """Typed into the trace page's field as an operator does; the answer is the CLI's (the
    test client's tests, test_console_trace.py, check every field on both databases)."""
    from tests.test_trace_cli import trace_workspace

    ws = trace_workspace(tmp_path / "traced", sql_url)
    quiet(ws)
    running = start_console(ws, "--read-only")  # a trace changes nothing: read-only serves it
    try:
        browser.get(running.url)
        go(browser, "#nav-trace")
        assert browser.title == "Trace · outbox console"
        by(browser, "#q").send_keys("corr-7")
        go(browser, "#find")
        assert browser.title == "Trace corr-7 · outbox console"
        assert by(browser, "#matched").text.startswith("Found by correlation id")
        writers = [c.text for c in every(browser, "#doc-1 table.versions td.writer")]
        assert writers == ["outbox", "dispatcher", "outbox"]
        fates = [c.text for c in every(browser, "#doc-1 table.messages td.fate")]
        assert fates == ["active", "pending"]
        screenshot(browser, tmp_path / "trace.png")
    finally:
        assert running.stop() == 0


# --- Paused ordering keys -----------------------------------------------------------------------


@sqlite_only
def test_a_paused_keys_gate_skipped_through_the_pages(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    from datetime import UTC, datetime

    from dispatcher.queue.key_lines import SqlKeyLines, Wait

    with SqlQueue(console_ws.url) as q:
        SqlKeyLines(q.database).hold(
            [Wait(("shipments", "customer-7"), d, "life", 1, f"{d}-1") for d in "AB"],
            "broker down",
            datetime(2026, 1, 1, tzinfo=UTC),
        )
    _unlock_in(browser, console)
    browser.get(console.url)
    go(browser, "#nav-keys")
    assert browser.title == "Paused keys · outbox console"
    assert by(browser, "#key-1 .gate").text == "A-1"
    go(browser, "#skip-1")
    assert by(browser, "#confirm-title").text == "Skip the gate of shipments/customer-7?"
    with SqlQueue(console_ws.url) as q:  # nothing before the yes
        assert [
            h.message_id for h in SqlKeyLines(q.database).lines()[("shipments", "customer-7")]
        ] == ["A-1", "B-1"]
    go(browser, "#confirm")
    assert by(browser, ".flash").text.endswith("gave up on A-1; the next held document goes next.")
    assert by(browser, "#key-1 .gate").text == "B-1"


# --- Live messages ------------------------------------------------------------------------------


@sqlite_only
def test_live_messages_and_sessions_from_the_overview(
    console: RunningConsole, browser: Any, tmp_path: Path
) -> None:
    browser.get(console.url)
    go(browser, "#queues a[href='/live?queue=devices']")
    assert browser.title == "devices · outbox console"
    assert [c.text for c in every(browser, "#live td.state")] == ["locked", "active"]
    screenshot(browser, tmp_path / "live.png")
    go(browser, "#state-locked")
    assert [c.text for c in every(browser, "#live td.state")] == ["locked"]
    go(browser, "#sessions")
    assert [c.text for c in every(browser, "#live-sessions td.mono:first-child")] == [
        "pump-1",
        "pump-2",
    ]


# --- Named operators and the audit trail --------------------------------------------------------


@sqlite_only
def test_a_named_operator_unlocks_and_the_audit_page_names_them(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    from click.testing import CliRunner

    from outbox.app.cli import main

    made = CliRunner().invoke(main, ["-w", str(console_ws.path), "operators", "create", "alice"])
    assert made.exit_code == 0, made.output
    browser.get(console.url + "unlock")
    by(browser, "#token").send_keys(made.stdout.strip())
    go(browser, "#unlock")
    assert by(browser, "#who").text == "alice (operator)"
    go(browser, "#nav-audit")
    assert browser.title == "Audit · outbox console"
    assert [c.text for c in every(browser, "#audit td.actor")][:1] == ["alice"]
    assert [c.text for c in every(browser, "#audit td.action")][:2] == [
        "unlock",
        "operators.create",
    ]


@sqlite_only
def test_a_selection_spanning_two_pages_in_the_browser(
    console: RunningConsole, browser: Any, console_ws: ConsoleWorkspace
) -> None:
    """No script: the pager is a button of the selection form (``formaction``), so what is
    ticked goes along to the next page."""
    from tests.console.conftest import dead_letter

    with SqlQueue(console_ws.url) as q:
        ids = sorted((dead_letter(q, "bulk", f"b-{i}", "Poison") for i in range(55)), reverse=True)
    _unlock_in(browser, console)
    browser.get(console.url + "dead-letters?queue=bulk")
    by(browser, f"#select-{ids[0]}").click()
    go(browser, "#older-keep")
    assert by(browser, "#carried").text == "1 more ticked on other pages."
    by(browser, f"#select-{ids[52]}").click()
    go(browser, "#requeue-selected")
    assert by(browser, "#confirm-title").text == "Requeue 2 dead letters?"
    go(browser, "#confirm")
    assert by(browser, ".flash").text == "2 dead letters requeued."
    with SqlQueue(console_ws.url) as q:
        # newest first: ids[0] is b-54's, ids[52] b-2's
        assert sorted(m.message_id for m in q.peek("bulk", 10)) == ["b-2", "b-54"]


@sqlite_only
def test_a_page_refreshes_itself_in_the_browser_when_asked(
    console: RunningConsole, browser: Any
) -> None:
    browser.get(console.url + "dead-letters")
    go(browser, "#refresh-10s")
    assert by(browser, "#refresh-10s").get_attribute("class") == "here"
    metas = every(browser, "meta[http-equiv=refresh]")
    assert [m.get_attribute("content") for m in metas] == ["10"]


@sqlite_only
def test_the_dead_letter_summary_in_the_browser(console: RunningConsole, browser: Any) -> None:
    browser.get(console.url + "dead-letters")
    go(browser, "#summary-link")
    assert browser.title == "Dead letters by queue and reason · outbox console"
    assert by(browser, "#grand-total").text == "4"
    assert [a.text for a in every(browser, "#summary a.queue-total")] == ["1", "3"]

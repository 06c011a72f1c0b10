"""The console's pages and its safety, through Flask's test client (the browser tests drive the
same app in Chromium: tests/console/test_browser.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient

from dispatcher.queue import QueueMessage, SqlQueue
from outbox.core.clock import ManualClock
from tests.console.conftest import (
    TOKEN,
    ConsoleWorkspace,
    console_client,
    csrf_of,
    dead_left,
    dead_letter,
    queued,
    unlock,
)

# --- pages -----------------------------------------------------------------------------------


def test_the_overview_shows_the_samples_the_queues_and_the_devices(client: FlaskClient) -> None:
    page = client.get("/").get_data(as_text=True)
    assert re.search(r'id="pending-documents">.*?<p class="big">7</p>', page, re.S)
    assert re.search(r'id="oldest-pending">.*?<p class="big">42s</p>', page, re.S)
    assert re.search(r'id="devices-online">.*?<p class="big">1</p>.*?1 offline', page, re.S)
    assert '<svg id="lag-chart"' in page
    assert "<title>nightly</title>" in page
    assert re.search(r"<td>nightly</td><td class=\"num\">49s</td>", page)  # the newest lag
    # the queue links to its live messages, its dead letters to their list
    assert re.search(
        r'<td><a href="/live\?queue=shipments">shipments</a></td>.*?>3</a>', page, re.S
    )


def test_the_dead_letters_filter_by_queue_reason_and_time(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    def listed(query: str) -> list[str]:
        page = client.get(f"/dead-letters?{query}").get_data(as_text=True)
        return re.findall(r'<td class="mono">([^<]+)</td>', page)

    assert listed("") == ["inv-0", "ship-2", "ship-1", "ship-0"]  # newest first
    assert listed("queue=shipments") == ["ship-2", "ship-1", "ship-0"]
    assert listed("reason=Timeout") == ["inv-0"]
    soon = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert listed(f"since={soon}") == []
    assert listed(f"until={soon}&queue=invoices") == ["inv-0"]
    bad = client.get("/dead-letters?since=yesterday").get_data(as_text=True)
    assert "since: &#39;yesterday&#39; is not a time" in bad


@pytest.mark.parametrize("window", ["", "&since=2000-01-01T00:00&until=2999-01-01T00:00"])
def test_the_dead_letters_page_below_the_last_one_shown(
    console_ws: ConsoleWorkspace, window: str
) -> None:
    """By id, or (with a time window) by time and id: the next page starts after the last row
    shown, and every dead letter is on exactly one page."""
    with SqlQueue(console_ws.url) as queue:
        for i in range(60):
            dead_letter(queue, "bulk", f"b-{i:02d}", "Poison")
    for client in console_client(console_ws):
        first = client.get(f"/dead-letters?queue=bulk{window}").get_data(as_text=True)
        shown = re.findall(r'<td class="mono">([^<]+)</td>', first)
        assert len(shown) == 50
        assert shown[0] == "b-59"
        older = re.search(r'href="(/dead-letters\?before=\d+[^"]*)" id="older"', first)
        assert older is not None
        rest = client.get(older.group(1).replace("&amp;", "&")).get_data(as_text=True)
        assert re.findall(r'<td class="mono">([^<]+)</td>', rest) == [
            f"b-{i:02d}" for i in range(9, -1, -1)
        ]
        assert 'id="older"' not in rest
        assert "60 dead letters match." in rest


def test_one_dead_letter_shows_its_body_headers_reason_and_tries(
    console_ws: ConsoleWorkspace,
) -> None:
    with SqlQueue(console_ws.url) as queue:
        i = dead_letter(
            queue,
            "shipments",
            "xss",
            "Poison",
            body=b'{"note": "<script>alert(1)</script>"}',
            headers={"traceparent": "00-abc-def-01"},
        )
    for client in console_client(console_ws):
        page = client.get(f"/dead-letters/{i}").get_data(as_text=True)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<script>" not in page
        assert '"traceparent": "00-abc-def-01"' in page.replace("&#34;", '"')
        assert re.search(r'id="reason">Poison<', page)
        assert re.search(r'id="delivery-count">1<', page)
        assert client.get("/dead-letters/999999").status_code == 404


def test_the_devices_page_shows_presence_the_task_out_and_tries(client: FlaskClient) -> None:
    page = client.get("/devices").get_data(as_text=True)
    rows = re.findall(r"<tr>\s*<td>(pump-\d)</td><td><span class=\"presence (\w+)\">", page)
    assert rows == [("pump-1", "online"), ("pump-2", "offline")]
    assert re.search(r"pump-1</td>.*?<td class=\"mono\">t-1</td><td class=\"num\">1</td>", page,
                     re.S)  # fmt: skip
    assert "waits for the device" in page  # pump-2: offline, its task waits
    offline = client.get("/devices?presence=offline").get_data(as_text=True)
    assert "pump-2" in offline
    assert "pump-1" not in offline


def test_devices_page_by_name(console_ws: ConsoleWorkspace) -> None:
    with SqlQueue(console_ws.url) as queue:
        for i in range(55):
            queue.send("fleet", QueueMessage(body=b"{}", session_id=f"d-{i:03d}"))
    for client in console_client(console_ws):
        first = client.get("/devices?queue=fleet").get_data(as_text=True)
        names = re.findall(r"<tr>\s*<td>(d-\d+)</td>", first)
        assert names == [f"d-{i:03d}" for i in range(50)]
        nxt = re.search(r'href="([^"]+)" id="next-devices"', first)
        assert nxt is not None
        rest = client.get(nxt.group(1).replace("&amp;", "&")).get_data(as_text=True)
        assert re.findall(r"<tr>\s*<td>(d-\d+)</td>", rest) == [f"d-{i:03d}" for i in range(50, 55)]


# --- actions ---------------------------------------------------------------------------------


def test_requeue_of_a_selection_after_a_confirmation(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    csrf = unlock(client)
    ids = [i for i, (_q, m) in console_ws.dead.items() if m in ("ship-0", "ship-1")]
    form = {"csrf": csrf, "action": "requeue", "scope": "selected", "id": [str(i) for i in ids]}
    confirm = client.post("/dead-letters/confirm", data=form).get_data(as_text=True)
    assert "Requeue 2 dead letters?" in confirm
    assert dead_left(console_ws) == {"ship-0", "ship-1", "ship-2", "inv-0"}  # not yet
    done = client.post("/dead-letters/apply", data=form, follow_redirects=True)
    assert "2 dead letters requeued." in done.get_data(as_text=True)
    assert dead_left(console_ws) == {"ship-2", "inv-0"}
    assert queued(console_ws, "shipments") == ["ship-0", "ship-1"]


def test_all_matching_is_frozen_at_the_confirmation(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    """A dead letter that arrives between the confirmation and the action is left alone: the
    operator confirmed what they saw."""
    csrf = unlock(client)
    form = {"csrf": csrf, "action": "purge", "scope": "matching", "reason": "Poison"}
    confirm = client.post("/dead-letters/confirm", data=form).get_data(as_text=True)
    assert "Purge 3 dead letters?" in confirm
    up_to = re.search(r'name="up_to" value="(\d+)"', confirm)
    assert up_to is not None
    with SqlQueue(console_ws.url) as queue:
        dead_letter(queue, "shipments", "late", "Poison")
    done = client.post("/dead-letters/apply", data={**form, "up_to": up_to.group(1)},
                       follow_redirects=True)  # fmt: skip
    assert "3 dead letters purged." in done.get_data(as_text=True)
    assert dead_left(console_ws) == {"late", "inv-0"}


def test_an_action_without_the_token_is_refused(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    csrf = csrf_of(client)
    [i] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    form = {"csrf": csrf, "action": "purge", "scope": "selected", "id": str(i)}
    for path in ("/dead-letters/confirm", "/dead-letters/apply"):
        r = client.post(path, data=form)
        assert r.status_code == 403
        assert "This action needs the console token" in r.get_data(as_text=True)
    assert "inv-0" in dead_left(console_ws)


def test_a_wrong_token_does_notunlock(client: FlaskClient) -> None:
    csrf = csrf_of(client, "/unlock")
    r = client.post("/unlock", data={"csrf": csrf, "token": TOKEN + "x"})
    assert r.status_code == 403
    assert 'id="wrong-token"' in r.get_data(as_text=True)
    assert client.get("/unlock?token=nope").status_code == 403
    assert 'id="mode" href="/unlock">locked' in client.get("/").get_data(as_text=True)


def test_a_form_without_this_sessions_csrf_token_is_refused_even_unlocked(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    unlock(client)
    [i] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    for csrf in ("", "forged"):
        form = {"csrf": csrf, "action": "purge", "scope": "selected", "id": str(i)}
        r = client.post("/dead-letters/apply", data=form)
        assert r.status_code == 400, csrf
    assert "inv-0" in dead_left(console_ws)


def test_the_read_only_console_shows_no_action_and_refuses_them(
    console_ws: ConsoleWorkspace,
) -> None:
    for client in console_client(console_ws, read_only=True):
        page = client.get("/dead-letters").get_data(as_text=True)
        assert "read-only" in page
        assert "Requeue" not in page
        assert 'type="checkbox"' not in page
        assert client.get(f"/unlock?token={TOKEN}").status_code == 403
        csrf = csrf_of(client)
        [i] = list(console_ws.dead)[:1]
        form = {"csrf": csrf, "action": "requeue", "scope": "selected", "id": str(i)}
        assert client.post("/dead-letters/apply", data=form).status_code == 403
    assert len(dead_left(console_ws)) == 4


def test_a_page_for_another_host_is_refused(client: FlaskClient) -> None:
    """On 127.0.0.1 the console answers only to loopback Host names: a site whose DNS name
    rebinds to 127.0.0.1 cannot read it through the victim's browser."""
    assert client.get("/", headers={"Host": "evil.example:8765"}).status_code == 400
    assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200


def test_every_page_sends_a_policy_that_forbids_scripts_and_frames(client: FlaskClient) -> None:
    r = client.get("/")
    assert "script-src" not in r.headers["Content-Security-Policy"]  # default-src 'none'
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    assert r.headers["X-Frame-Options"] == "DENY"
    assert "<script" not in r.get_data(as_text=True)
    assert r.headers["Cache-Control"] == "no-store"


def test_no_page_shows_a_secret(console_ws: ConsoleWorkspace) -> None:
    from outbox.core.sql import redact_url

    secret_url = "postgresql://outbox:s3cret-pw@db.example:5432/outbox"
    for client in console_client(console_ws, sql_url=redact_url(secret_url), table_uri="s3://b/t"):
        csrf = unlock(client)
        paths = (
            "/",
            "/dead-letters",
            "/devices",
            "/unlock",
            f"/dead-letters/{min(console_ws.dead)}",
        )
        pages = [client.get(p).get_data(as_text=True) for p in paths]
        pages.append(
            client.post(
                "/dead-letters/confirm",
                data={"csrf": csrf, "action": "requeue", "scope": "matching"},
            ).get_data(as_text=True)
        )
        for page in pages:
            assert "s3cret-pw" not in page
            assert TOKEN not in page
        assert "db.example" in pages[0]  # the redacted address is shown


def test_the_overview_says_when_nothing_was_sampled(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from outbox.app.cli import main

    ws = tmp_path / "empty"
    assert CliRunner().invoke(main, ["-w", str(ws), "migrate"]).exit_code == 0
    empty = ConsoleWorkspace(ws, f"sqlite:///{ws / 'outbox.db'}", {})
    for client in console_client(empty, clock=ManualClock(datetime(2026, 11, 26, tzinfo=UTC))):
        page = client.get("/").get_data(as_text=True)
        assert "No sample yet" in page
        assert "No lag sampled in this range." in page


def test_an_unlock_form_without_this_sessions_csrf_token_is_refused(client: FlaskClient) -> None:
    """Even with the right token: a session that never had a form has no CSRF token, and an
    empty one must not pass for it."""
    r = client.post("/unlock", data={"csrf": "", "token": TOKEN})
    assert r.status_code == 400
    assert 'id="mode" href="/unlock">locked' in client.get("/").get_data(as_text=True)

"""The console's trace page (issue 46, item 1): ``outbox trace``'s answer as a page, through the
test client on SQLite and PostgreSQL, on the workspace tests/test_trace_cli.py traces (a document
saved, marked and saved again with a message pending and its ProcessDocument command), with a
dead letter linked to its page; an unknown id, an overlong one and markup in the query are one
line each, escaped. The same page in Chromium: tests/console/test_browser.py."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from datetime import timedelta
from html import unescape
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from dispatcher.queue import SqlQueue
from outbox.app.console import ConsoleConfig, create_app
from outbox.app.history import History
from outbox.app.trace import trace
from outbox.core.clock import ManualClock
from outbox.core.settings import Settings
from tests.console.conftest import HOST, TOKEN
from tests.test_trace_cli import QUEUE, T1, trace_workspace

NOW = T1 + timedelta(seconds=90)  # the pending message is 90 s old


@pytest.fixture
def ws(tmp_path: Path, sql_url: str) -> Path:
    return trace_workspace(tmp_path / "ws", sql_url)


def _client(ws: Path, *, with_trace: bool = True) -> Iterator[FlaskClient]:
    settings = Settings.load(ws)
    with SqlQueue(settings.sql_url) as queue:
        config = ConsoleConfig(
            queue=queue,
            history=History(queue.database),
            clock=ManualClock(NOW),
            token=TOKEN,
            trace=functools.partial(trace, settings, ManualClock(NOW)) if with_trace else None,
        )
        client = create_app(config).test_client()
        client.environ_base.update({"HTTP_HOST": HOST["Host"]})
        yield client


@pytest.fixture
def client(ws: Path) -> Iterator[FlaskClient]:
    yield from _client(ws)


def _rows(page: str, table: str) -> list[list[str]]:
    """The text of each body row's cells of ``<table class="TABLE">``."""
    found = re.search(rf'<table class="{table}">(.*?)</table>', page, re.S)
    assert found, page
    body = found.group(1).split("<tbody>", 1)[1]
    return [
        [
            unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)
        ]
        for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_the_page_shows_a_documents_versions_messages_and_command(client: FlaskClient) -> None:
    empty = client.get("/trace")
    assert empty.status_code == 200
    assert 'id="trace-form"' in empty.get_data(as_text=True)

    r = client.get("/trace", query_string={"q": "pkg-1"})
    assert r.status_code == 200
    page = r.get_data(as_text=True)
    assert "Found by document id" in page
    versions = _rows(page, "versions")
    # two saves by the embedded writer, a mark by the dispatcher between them
    assert [(v[2], v[5], v[7]) for v in versions] == [
        ("outbox", "1", "0"),
        ("dispatcher", "mark", "1"),
        ("outbox", "2", "1"),
    ]
    messages = {m[2]: m for m in _rows(page, "messages")}
    assert messages["Left"][4] == "active"
    assert messages["Left"][5].startswith(f"in {QUEUE} (active")
    assert messages["Arrived"][4] == "pending"
    assert messages["Arrived"][5] == "waiting 1m30s"
    assert versions[0][8] == messages["Left"][1]  # the save that added it
    [command] = _rows(page, "commands")
    assert (command[1], command[2]) == ("2", "active")


def test_a_dead_lettered_message_links_to_its_dead_letter(client: FlaskClient, ws: Path) -> None:
    with SqlQueue(Settings.load(ws).sql_url) as queue:
        [received] = queue.receive(QUEUE, session_id="pkg-1")
        queue.dead_letter(received, "BadAddress", "no such street")
        [dead] = queue.list_dead_letters(QUEUE, 10)
    dead_id = dead.id
    page = client.get("/trace", query_string={"q": received.message_id}).get_data(as_text=True)
    assert "Found by message id" in page
    messages = {m[2]: m for m in _rows(page, "messages")}
    assert messages["Left"][4] == "dead-lettered"
    assert f'href="/dead-letters/{dead_id}"' in page
    assert "BadAddress after 1 deliveries" in messages["Left"][5]
    shown = client.get(f"/dead-letters/{dead_id}")
    assert shown.status_code == 200
    assert "BadAddress" in shown.get_data(as_text=True)


def test_by_correlation_id_and_what_is_not_found(client: FlaskClient) -> None:
    page = client.get("/trace", query_string={"q": "corr-7"}).get_data(as_text=True)
    assert "Found by correlation id" in page
    assert '<span class="mono">pkg-1</span>' in page

    missing = client.get("/trace", query_string={"q": "<b>nope</b>"})
    assert missing.status_code == 404
    text = missing.get_data(as_text=True)
    assert "no document, message or correlation id" in text
    assert "<b>nope</b>" not in text  # escaped, in the field and in the problem
    assert "&lt;b&gt;nope&lt;/b&gt;" in text

    too_long = client.get("/trace", query_string={"q": "x" * 2000})
    assert too_long.status_code == 400
    assert "at most 1024 characters" in too_long.get_data(as_text=True)


def test_a_console_without_a_table_offers_no_trace(ws: Path) -> None:
    for client in _client(ws, with_trace=False):
        assert client.get("/trace", query_string={"q": "pkg-1"}).status_code == 404
        assert 'id="nav-trace"' not in client.get("/").get_data(as_text=True)
    for client in _client(ws):
        assert 'id="nav-trace"' in client.get("/").get_data(as_text=True)


def test_a_rescue_pass_that_commanded_it_is_a_row(client: FlaskClient, ws: Path) -> None:
    from outbox.app.checker.rescue import OffsetClock
    from outbox.app.rescue import open_rescuer
    from outbox.core.clock import SystemClock

    settings = Settings.load(ws)
    assert 'class="rescues"' not in client.get("/trace", query_string={"q": "pkg-1"}).text
    with open_rescuer(settings, clock=OffsetClock(3600), queue_clock=SystemClock()) as rescuer:
        rescuer.rescue_pass.run()
    page = client.get("/trace", query_string={"q": "pkg-1"}).get_data(as_text=True)
    [row] = _rows(page, "rescues")
    assert row[1:4] == [settings.rescuer_name, "local", "sweep"]  # its first pass: no checkpoint
    assert row[5] == "2"  # the seq its command asked to be sent

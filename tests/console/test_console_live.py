"""The console's live messages (issue 46, item 2), through the test client on SQLite and
PostgreSQL: a queue's messages in each state (active, scheduled, deferred, locked) with the
state's count, one message with its body and headers (escaped), the sessions with their head
message, pages by sequence number, and one line for a bad queue, state or number. Nothing on
these pages changes anything: no form but the lock's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from flask.testing import FlaskClient

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from outbox.core.clock import utc
from tests.console.conftest import ConsoleWorkspace, console_client

QUEUE = "orders"


@pytest.fixture
def live(console_ws: ConsoleWorkspace) -> ConsoleWorkspace:
    """orders: o-active (markup in its body and a header), o-scheduled (due in an hour),
    o-deferred, o-locked (received); and o-0 .. o-59 after them, active."""
    with SqlQueue(console_ws.url) as q:
        later = utc(q.clock.now()) + timedelta(hours=1)
        marked = b'{"note": "<script>x</script>"}'
        q.send(
            QUEUE,
            QueueMessage(marked, "o-active", "cust-1", headers={"origin": "<b>web</b>"}),
        )
        q.send(QUEUE, QueueMessage(body=b"{}", message_id="o-scheduled", not_before=later))
        q.send(QUEUE, QueueMessage(body=b"{}", message_id="o-deferred", session_id="cust-2"))
        q.send(QUEUE, QueueMessage(body=b"{}", message_id="o-locked", session_id="cust-3"))
        [d] = q.receive(QUEUE, session_id="cust-2")
        q.defer(d)
        q.receive(QUEUE, session_id="cust-3")
        q.send(QUEUE, [QueueMessage(body=b"{}", message_id=f"o-{i}") for i in range(60)])
    return console_ws


@pytest.fixture
def client(live: ConsoleWorkspace) -> Iterator[FlaskClient]:
    yield from console_client(live)


def _ids(page: str) -> list[str]:
    return re.findall(r'<td class="mono">([^<]+)</td><td>', page)


def _page(client: FlaskClient, **args: str) -> str:
    r = client.get("/live", query_string={"queue": QUEUE, **args})
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_data(as_text=True)


def test_each_state_lists_its_messages_with_its_count(client: FlaskClient) -> None:
    for state, expected in (
        ("active", "o-active"),
        ("scheduled", "o-scheduled"),
        ("deferred", "o-deferred"),
        ("locked", "o-locked"),
    ):
        page = _page(client, state=state)
        ids = _ids(page)
        assert ids[0] == expected, (state, ids)
        if state != "active":
            assert ids == [expected], state
    page = _page(client)
    assert 'id="state-active">active 61</a>' in page
    assert 'id="state-locked">locked 1</a>' in page
    assert 'id="state-all">all 64</a>' in page
    assert '<form method="post"' not in page.split("</header>", 1)[1]  # read-only page


def test_pages_go_by_sequence_number(client: FlaskClient) -> None:
    first = _page(client, state="active")
    assert len(_ids(first)) == 50
    after = re.search(r'after=(\d+)" id="next"', first)
    assert after, first
    second = _page(client, state="active", after=after.group(1))
    assert len(_ids(second)) == 11
    assert set(_ids(first)).isdisjoint(_ids(second))
    assert 'id="next"' not in second


def test_one_message_with_its_body_and_headers_escaped(
    client: FlaskClient, live: ConsoleWorkspace
) -> None:
    page = _page(client, state="active")
    seq = re.search(r'seq=(\d+)" id="show-\d+">', page)
    assert seq, page
    shown = client.get("/live/message", query_string={"queue": QUEUE, "seq": seq.group(1)})
    assert shown.status_code == 200
    text = shown.get_data(as_text=True)
    assert "o-active" in text
    assert "&lt;script&gt;" in text
    assert "<script>" not in text
    assert "&lt;b&gt;web&lt;/b&gt;" in text
    with SqlQueue(live.url) as q:  # completed meanwhile: gone, a 404 that says so
        [m] = q.receive(QUEUE, session_id="cust-1")
        q.complete(m)
    gone = client.get("/live/message", query_string={"queue": QUEUE, "seq": seq.group(1)})
    assert gone.status_code == 404
    assert "No message" in gone.get_data(as_text=True)


def test_sessions_with_their_head_message(client: FlaskClient) -> None:
    r = client.get("/live/sessions", query_string={"queue": "devices"})
    assert r.status_code == 200
    page = r.get_data(as_text=True)
    rows = re.findall(r'<tr><td class="mono">([^<]+)</td><td class="num">(\d+)</td>'
                      r'<td class="mono">([^<]+)</td>.*?<td class="state">(\w+)</td>'
                      r".*?</td><td>([^<]*)</td></tr>", page, re.S)  # fmt: skip
    assert [(s, n, head, state, paused.strip()) for s, n, head, state, paused in rows] == [
        ("pump-1", "1", "t-1", "locked", ""),
        ("pump-2", "1", "t-2", "active", "paused (offline)"),
    ]


@pytest.mark.parametrize(
    ("path", "args"),
    [
        ("/live", {"queue": "no queue!"}),
        ("/live", {"queue": QUEUE, "state": "exploded"}),
        ("/live", {"queue": QUEUE, "after": "-1"}),
        ("/live", {"queue": QUEUE, "after": str(2**64)}),
        ("/live/message", {"queue": QUEUE}),
        ("/live/message", {"queue": QUEUE, "seq": "x"}),
        ("/live/sessions", {"queue": QUEUE, "after": "s" * 200}),
    ],
)
def test_bad_input_is_one_line(client: FlaskClient, path: str, args: dict[str, str]) -> None:
    r = client.get(path, query_string=args)
    assert r.status_code == 400
    assert 'id="error-title"' in r.get_data(as_text=True)

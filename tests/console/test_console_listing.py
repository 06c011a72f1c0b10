"""What every list page offers besides its rows (issue 46, item 6), through the test client on
SQLite and PostgreSQL: a refresh the browser does itself when asked (no script), the whole list
exported as CSV or JSON with the page's filters (beyond one page), and the workspace and database
the page shows named on it."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from tests.console.conftest import ConsoleWorkspace, console_client


@pytest.fixture
def client(console_ws: ConsoleWorkspace) -> Iterator[FlaskClient]:
    with SqlQueue(console_ws.url) as q:  # more than a page of live messages
        q.send("orders", [QueueMessage(body=b"{}", message_id=f"o-{i}") for i in range(70)])
    yield from console_client(console_ws, table_uri="/srv/ws/documents", sql_url="sqlite:///q.db")


def test_a_page_refreshes_itself_only_when_asked(client: FlaskClient) -> None:
    off = client.get("/dead-letters?queue=shipments").get_data(as_text=True)
    assert 'http-equiv="refresh"' not in off
    assert 'href="/dead-letters?queue=shipments&amp;refresh=30" id="refresh-30s"' in off
    on = client.get("/dead-letters?queue=shipments&refresh=30").get_data(as_text=True)
    assert '<meta http-equiv="refresh" content="30">' in on
    assert 'id="refresh-30s" class="here"' in on
    for ignored in ("2", "99999", "x"):
        page = client.get(f"/?refresh={ignored}").get_data(as_text=True)
        assert 'http-equiv="refresh"' not in page


def test_the_whole_list_exports_as_csv_and_json_with_its_filters(client: FlaskClient) -> None:
    page = client.get("/dead-letters?queue=shipments").get_data(as_text=True)
    assert 'href="/dead-letters?queue=shipments&amp;format=csv" id="export-csv"' in page
    r = client.get("/dead-letters?queue=shipments&format=csv")
    assert r.status_code == 200
    assert r.mimetype == "text/csv"
    assert r.headers["Content-Disposition"] == 'attachment; filename="dead-letters.csv"'
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert sorted(row["message_id"] for row in rows) == ["ship-0", "ship-1", "ship-2"]
    assert {row["reason"] for row in rows} == {"Poison"}

    every = json.loads(client.get("/dead-letters?format=json").get_data(as_text=True))
    assert len(every) == 4
    assert set(every[0]) >= {"id", "queue", "message_id", "reason", "dead_lettered_at"}
    assert "body" not in every[0]

    live = json.loads(client.get("/live?queue=orders&format=json").get_data(as_text=True))
    assert len(live) == 70  # a page holds 50: the export holds them all
    assert [m["message_id"] for m in live[:2]] == ["o-0", "o-1"]
    sessions = json.loads(client.get("/live/sessions?queue=devices&format=json").get_data())
    assert [(s["session_id"], s["head_message_id"]) for s in sessions] == [
        ("pump-1", "t-1"),
        ("pump-2", "t-2"),
    ]
    assert json.loads(client.get("/keys?format=json").get_data()) == []
    assert (
        client.get("/audit?format=csv")
        .get_data(as_text=True)
        .startswith("id,at,actor,action,target,outcome")
    )
    assert client.get("/dead-letters?format=xml").status_code == 400


def test_each_page_names_its_workspace_and_database(client: FlaskClient) -> None:
    page = client.get("/live?queue=orders").get_data(as_text=True)
    assert (
        '<footer id="workspace">table /srv/ws/documents · database sqlite:///q.db</footer>' in page
    )


def _bulk(ws: ConsoleWorkspace, n: int) -> list[int]:
    """``n`` dead letters on queue "bulk", newest first as the list shows them."""
    from tests.console.conftest import dead_letter

    with SqlQueue(ws.url) as q:
        ids = [dead_letter(q, "bulk", f"b-{i}", "Poison") for i in range(n)]
    return sorted(ids, reverse=True)


def test_a_selection_spans_pages(client: FlaskClient, console_ws: ConsoleWorkspace) -> None:
    import re

    from tests.console.conftest import unlock

    ids = _bulk(console_ws, 60)
    csrf = unlock(client)
    first = client.get("/dead-letters?queue=bulk").get_data(as_text=True)
    older = re.search(r'name="before" value="(\d+)" id="older-keep"', first)
    assert older, first
    form = {"csrf": csrf, "queue": "bulk", "id": [str(ids[0]), str(ids[1])]}
    second = client.post("/dead-letters/turn", data={**form, "before": older.group(1)})
    assert second.status_code == 200
    page = second.get_data(as_text=True)
    assert f'<input type="hidden" name="id" value="{ids[0]}">' in page
    assert "2 more ticked on other pages." in page
    assert f'id="select-{ids[55]}"' in page  # the second page's rows
    back = client.post("/dead-letters/turn", data={**form, "before": ""}).get_data(as_text=True)
    assert f'id="select-{ids[0]}" aria-label="select {ids[0]}" checked' in back
    assert "more ticked on other pages" not in back  # both are on this page again

    confirm = client.post(
        "/dead-letters/confirm",
        data={**form, "id": [str(ids[0]), str(ids[1]), str(ids[55])], "scope": "selected",
              "action": "requeue"},
    )  # fmt: skip
    assert confirm.status_code == 200
    assert "Requeue 3 dead letters?" in confirm.get_data(as_text=True)
    foreign = client.post("/dead-letters/turn", data={**form, "csrf": "x", "before": ""})
    assert foreign.status_code == 400

"""The console's paused ordering keys (issue 46, item 4), through the test client on SQLite and
PostgreSQL: listed with the message each waits for, since when, why and how many wait behind;
skipped or opened only behind the confirmation page and the token (a read-only console offers
neither, a locked one refuses), with the key's line in the database changed only by the yes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from flask.testing import FlaskClient

from dispatcher.queue.key_lines import SqlKeyLines, Wait
from dispatcher.queue.sql_queue import SqlQueue
from tests.console.conftest import ConsoleWorkspace, console_client, csrf_of, unlock

SINCE = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def paused(console_ws: ConsoleWorkspace) -> ConsoleWorkspace:
    """Key shipments/customer-7 paused at A-1 with B and C behind; invoices/acct-<b> at X-1."""
    with SqlQueue(console_ws.url) as queue:
        lines = SqlKeyLines(queue.database)
        lines.hold(
            [Wait(("shipments", "customer-7"), d, "life", 1, f"{d}-1") for d in "ABC"],
            "broker down",
            SINCE,
        )
        lines.hold([Wait(("invoices", "acct-<b>"), "X", "life", 1, "X-1")], "<refused>", SINCE)
    return console_ws


@pytest.fixture
def client(paused: ConsoleWorkspace) -> Iterator[FlaskClient]:
    yield from console_client(paused)


def _gates(ws: ConsoleWorkspace) -> dict[tuple[str, str], list[str]]:
    with SqlQueue(ws.url) as queue:
        return {
            key: [h.message_id for h in line]
            for key, line in SqlKeyLines(queue.database).lines(None).items()
        }


def _form(csrf: str, how: str, key: str = "customer-7", gate: str = "A-1") -> dict[str, str]:
    return {"csrf": csrf, "how": how, "destination": "shipments", "key": key, "gate": gate}


def test_the_page_lists_each_paused_key_escaped(client: FlaskClient) -> None:
    r = client.get("/keys")
    assert r.status_code == 200
    page = r.get_data(as_text=True)
    assert "2 paused keys." in page
    assert '<td class="mono gate">A-1</td>' in page
    assert "broker down" in page
    assert ">2</td>" in page  # B and C held behind A
    assert "acct-&lt;b&gt;" in page
    assert "acct-<b>" not in page
    assert "&lt;refused&gt;" in page
    assert 'id="skip-1"' in page
    assert 'id="open-1"' in page


def test_skipping_a_gate_needs_the_confirmation_and_the_token(
    client: FlaskClient, paused: ConsoleWorkspace
) -> None:
    csrf = csrf_of(client, "/keys")
    locked = client.post("/keys/confirm", data=_form(csrf, "skip"))
    assert locked.status_code == 403
    assert _gates(paused)[("shipments", "customer-7")] == ["A-1", "B-1", "C-1"]

    csrf = unlock(client)
    confirm = client.post("/keys/confirm", data=_form(csrf, "skip"))
    assert confirm.status_code == 200
    text = confirm.get_data(as_text=True)
    assert "Skip the gate of shipments/customer-7?" in text
    assert "2 held behind it" in text
    assert _gates(paused)[("shipments", "customer-7")] == ["A-1", "B-1", "C-1"]  # not yet

    done = client.post("/keys/apply", data=_form(csrf, "skip"), follow_redirects=True)
    assert done.status_code == 200
    assert "gave up on A-1; the next held document goes next." in done.get_data(as_text=True)
    assert _gates(paused)[("shipments", "customer-7")] == ["B-1", "C-1"]

    again = client.post("/keys/apply", data=_form(csrf, "skip"), follow_redirects=True)
    assert "nothing to do" in again.get_data(as_text=True)  # its gate is B-1 now
    assert _gates(paused)[("shipments", "customer-7")] == ["B-1", "C-1"]


def test_opening_a_key_ends_its_line(client: FlaskClient, paused: ConsoleWorkspace) -> None:
    csrf = unlock(client)
    done = client.post("/keys/apply", data=_form(csrf, "open", gate=""), follow_redirects=True)
    assert "shipments/customer-7: opened." in done.get_data(as_text=True)
    assert ("shipments", "customer-7") not in _gates(paused)
    assert ("invoices", "acct-<b>") in _gates(paused)


def test_bad_forms_and_a_read_only_console(client: FlaskClient, paused: ConsoleWorkspace) -> None:
    csrf = unlock(client)
    assert client.post("/keys/apply", data=_form(csrf, "explode")).status_code == 400
    assert client.post("/keys/apply", data=_form(csrf, "skip", gate="")).status_code == 400
    assert client.post("/keys/apply", data=_form(csrf, "skip", key="k" * 2000)).status_code == 400
    foreign = client.post("/keys/apply", data=_form("not-the-csrf", "open"))
    assert foreign.status_code == 400
    assert len(_gates(paused)) == 2

    for ro in console_client(paused, read_only=True):
        page = ro.get("/keys").get_data(as_text=True)
        assert "2 paused keys." in page
        assert 'id="skip-1"' not in page
        assert ro.post("/keys/apply", data=_form("x", "open")).status_code == 403
    assert len(_gates(paused)) == 2

"""What a request can carry that the pages must read right: ids out of any range, bodies cut
inside a character, text beyond ASCII, times with an offset; and the icon every browser asks
for. Through Flask's test client on the real queue database (SQLite and PostgreSQL)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flask.testing import FlaskClient

from dispatcher.queue import SqlQueue
from outbox.app.console.reads import BODY_SHOWN
from tests.console.conftest import ConsoleWorkspace, console_client, dead_left, dead_letter, unlock

HUGE = "99999999999999999999"  # past any 64-bit id: it overflowed the database driver


def _page(client: FlaskClient, path: str) -> str:
    return client.get(path).get_data(as_text=True)


# --- ids ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path_id", ["0", HUGE, str(2**63)])
def test_a_dead_letter_id_no_dead_letter_can_have_is_not_found(
    client: FlaskClient, path_id: str
) -> None:
    r = client.get(f"/dead-letters/{path_id}")
    assert r.status_code == 404
    assert f"No dead letter has id {path_id}" in r.get_data(as_text=True)


@pytest.mark.parametrize("before", [HUGE, "0", "-3", "abc", "1" * 5000])
def test_a_bad_before_is_a_bad_request(client: FlaskClient, before: str) -> None:
    r = client.get(f"/dead-letters?before={before}")
    assert r.status_code == 400
    page = r.get_data(as_text=True)
    assert "before:" in page
    assert "is not a dead letter id" in page


def test_the_largest_id_is_read_not_refused(client: FlaskClient) -> None:
    assert client.get(f"/dead-letters/{2**63 - 1}").status_code == 404  # asked, not there
    assert client.get(f"/dead-letters?before={2**63 - 1}").status_code == 200


def test_a_bad_id_in_a_confirmation_or_an_action_is_a_bad_request(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    csrf = unlock(client)
    [inv] = [i for i, (_q, m) in console_ws.dead.items() if m == "inv-0"]
    selected = {"csrf": csrf, "action": "purge", "scope": "selected"}
    for path in ("/dead-letters/confirm", "/dead-letters/apply"):
        for bad in (HUGE, "0", "x"):
            r = client.post(path, data={**selected, "id": [str(inv), bad]})
            assert r.status_code == 400, (path, bad)
            assert "id: " in r.get_data(as_text=True)
    matching = {"csrf": csrf, "action": "purge", "scope": "matching", "up_to": HUGE}
    r = client.post("/dead-letters/apply", data=matching)
    assert r.status_code == 400
    assert "up_to: " in r.get_data(as_text=True)
    assert len(dead_left(console_ws)) == 4  # nothing was purged


# --- bodies and headers ------------------------------------------------------------------------


def test_a_body_cut_inside_a_character_is_shown_as_text(console_ws: ConsoleWorkspace) -> None:
    body = ("a" * (BODY_SHOWN - 1) + "ë" * 10).encode()  # the cut falls inside the first ë
    with SqlQueue(console_ws.url) as queue:
        i = dead_letter(queue, "shipments", "long", "Poison", body=body)
    for client in console_client(console_ws):
        page = _page(client, f"/dead-letters/{i}")
        assert re.search(r"<h2>Body <span class=\"small\">text, [\d,]+ bytes, cut short", page)
        shown = re.search(r'<pre id="body">([^<]*)</pre>', page)
        assert shown is not None
        assert shown.group(1) == "a" * (BODY_SHOWN - 1)  # the half character left out


def test_a_binary_body_is_still_shown_in_hex(console_ws: ConsoleWorkspace) -> None:
    with SqlQueue(console_ws.url) as queue:
        i = dead_letter(queue, "shipments", "bin", "Poison", body=b"\xff\xfe\x00\x01" * 10)
    for client in console_client(console_ws):
        assert "binary (hex)" in _page(client, f"/dead-letters/{i}")


def test_json_bodies_and_headers_show_their_characters(console_ws: ConsoleWorkspace) -> None:
    with SqlQueue(console_ws.url) as queue:
        i = dead_letter(
            queue,
            "shipments",
            "accents",
            "Poison",
            body='{"city": "Zoë\'s Köln", "n": 1}'.encode(),
            headers={"customer": "Zoë"},
        )
        lone = dead_letter(queue, "shipments", "lone", "Poison", body=b'{"odd": "\\ud800"}')
    for client in console_client(console_ws):
        page = _page(client, f"/dead-letters/{i}")
        assert "Zoë&#39;s Köln" in page  # the body
        assert "&#34;customer&#34;: &#34;Zoë&#34;" in page  # the headers
        assert "\\u00eb" not in page
        # a lone surrogate is valid JSON but no UTF-8: shown escaped, not a failed page
        odd = client.get(f"/dead-letters/{lone}")
        assert odd.status_code == 200
        assert "\\ud800" in odd.get_data(as_text=True)


# --- times -------------------------------------------------------------------------------------


def test_a_time_with_an_offset_is_converted_to_utc(
    console_ws: ConsoleWorkspace, client: FlaskClient
) -> None:
    """An hour ago written in UTC+05:00 reads 4 h ahead of UTC if its offset is dropped, and
    then lists nothing."""
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
    local = hour_ago.astimezone(timezone(timedelta(hours=5))).isoformat(timespec="minutes")
    assert local.endswith("+05:00")
    page = _page(client, f"/dead-letters?since={local.replace('+', '%2B')}")
    assert re.findall(r'<td class="mono">([^<]+)</td>', page) == [
        "inv-0", "ship-2", "ship-1", "ship-0"
    ]  # fmt: skip
    shown = hour_ago.replace(tzinfo=None).isoformat(timespec="minutes")
    assert f'name="since" value="{shown}"' in page  # the UTC field says what was listed
    ahead = (datetime.now(UTC) + timedelta(hours=1)).astimezone(timezone(timedelta(hours=-3)))
    until = ahead.isoformat(timespec="minutes").replace("+", "%2B")
    assert len(re.findall(r'<td class="mono">', _page(client, f"/dead-letters?until={until}")))
    assert re.findall(
        r'<td class="mono">', _page(client, f"/dead-letters?since={until}")
    ) == []  # fmt: skip


# --- the icon ----------------------------------------------------------------------------------


def test_every_page_links_an_icon_that_is_served(client: FlaskClient) -> None:
    """Without one, every first page load logged a 404 for /favicon.ico in the browser."""
    page = _page(client, "/")
    icon = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', page)
    assert icon is not None
    for path in (icon.group(1), "/favicon.ico"):  # /favicon.ico: where a browser looks anyway
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.mimetype == "image/svg+xml"
        assert r.get_data(as_text=True).startswith("<svg ")

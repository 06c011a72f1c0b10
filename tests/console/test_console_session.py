"""Lock must lock: the unlocked state lives on the server, so a copy of the cookie is refused once
the browser it came from locks, and a cookie from before a restart unlocks nothing; each console
has a cookie of its own; the Host names it answers to (IPv6 literals too). Through Flask's test
client on the real queue database; the browser tests drive the same in Chromium."""

from __future__ import annotations

from flask.testing import FlaskClient

from dispatcher.queue import SqlQueue
from outbox.app.console import ConsoleConfig, create_app
from outbox.app.console import security as sec
from outbox.app.history import History
from outbox.core.clock import SystemClock
from tests.console.conftest import (
    HOST,
    TOKEN,
    ConsoleWorkspace,
    console_client,
    csrf_of,
    dead_left,
    unlock,
)

DOMAIN = "localhost"  # where the test client keeps cookies (its own base URL, not the Host sent)


def _purge_form(ws: ConsoleWorkspace, csrf: str) -> dict[str, str]:
    [inv] = [i for i, (_q, m) in ws.dead.items() if m == "inv-0"]
    return {"csrf": csrf, "action": "purge", "scope": "selected", "id": str(inv)}


def _copy(client: FlaskClient, into: FlaskClient) -> None:
    """What a stolen or copied cookie is: the same value in another browser."""
    name = client.application.config["SESSION_COOKIE_NAME"]
    cookie = client.get_cookie(name, domain=DOMAIN)
    assert cookie is not None, "the console set no session cookie"
    into.set_cookie(name, cookie.value, domain=DOMAIN)
    into.environ_base.update({"HTTP_HOST": HOST["Host"]})


def test_a_copy_of_the_cookie_taken_before_lock_is_refused_after_it(
    console_ws: ConsoleWorkspace,
) -> None:
    for client in console_client(console_ws):
        _lock_refuses_the_copy(console_ws, client)


def _lock_refuses_the_copy(console_ws: ConsoleWorkspace, client: FlaskClient) -> None:
    csrf = unlock(client)
    thief = client.application.test_client()
    _copy(client, thief)
    form = _purge_form(console_ws, csrf)
    # the copy works while the browser it came from is unlocked (a confirmation changes nothing)
    assert thief.post("/dead-letters/confirm", data=form).status_code == 200

    assert client.post("/lock", data={"csrf": csrf}).status_code == 302
    assert 'id="mode" href="/unlock">locked' in client.get("/").get_data(as_text=True)
    for path in ("/dead-letters/confirm", "/dead-letters/apply"):
        refused = thief.post(path, data=form)
        assert refused.status_code == 403, path
        assert "This action needs the console token" in refused.get_data(as_text=True)
    assert "inv-0" in dead_left(console_ws)
    assert 'id="mode" href="/unlock">locked' in thief.get("/").get_data(as_text=True)


def test_a_cookie_from_before_a_restart_unlocks_nothing(console_ws: ConsoleWorkspace) -> None:
    """Even if the restarted console signed cookies with the same key (the default is a new key
    per start, which refuses the old cookie by itself): the new process holds no session."""
    key = b"the-same-key-across-the-restart"
    for before in console_client(console_ws, secret_key=key):
        csrf = unlock(before)
        for after in console_client(console_ws, secret_key=key):  # the console again: port, key
            _copy(before, after)
            r = after.post("/dead-letters/apply", data=_purge_form(console_ws, csrf))
            assert r.status_code == 403
            assert "This action needs the console token" in r.get_data(as_text=True)
    assert "inv-0" in dead_left(console_ws)


def test_lock_forgets_the_server_side_session() -> None:
    """The registry itself: unlocking opens a session on the server, locking closes it, and a
    session id the server never gave finds nothing."""
    sessions = sec.Sessions(SystemClock())
    one, two = sessions.open(), sessions.open()
    assert one.id != two.id
    assert sessions.find(one.id) == one
    sessions.close(one.id)
    assert sessions.find(one.id) is None
    assert sessions.find(two.id) == two
    assert sessions.find("made-up") is None
    assert sessions.find(None) is None
    sessions.LIMIT = 2  # a bound on memory: one more forgets the oldest
    three = sessions.open()
    assert sessions.find(two.id) == two
    assert sessions.find(three.id) == three
    sessions.open()
    assert sessions.find(two.id) is None


def test_each_console_names_its_cookie_after_its_port(console_ws: ConsoleWorkspace) -> None:
    """Browsers keep cookies per host, not per port: two consoles on 127.0.0.1 with one cookie
    name overwrote each other's. (Chromium with two consoles: test_browser.py.)"""
    with SqlQueue(console_ws.url) as queue:
        names = [
            create_app(
                ConsoleConfig(
                    queue=queue,
                    history=History(queue.database),
                    clock=SystemClock(),
                    token=TOKEN,
                    port=port,
                )
            ).config["SESSION_COOKIE_NAME"]
            for port in (8765, 8766)
        ]
    assert names == ["outbox_console_8765", "outbox_console_8766"]


def test_a_console_on_ipv6_loopback_answers_to_its_address(console_ws: ConsoleWorkspace) -> None:
    """Werkzeug's TRUSTED_HOSTS cuts each name at its first colon, so ``[::1]`` could never be
    trusted there (a real process bound to ::1: test_console_cli.py)."""
    for client in console_client(console_ws, host="::1"):
        assert client.get("/", headers={"Host": "[::1]:8765"}).status_code == 200
        assert client.get("/", headers={"Host": "[::1]"}).status_code == 200
        assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200
        for other in ("evil.example:8765", "[::2]:8765", "[::1]evil", "[2001:db8::1]:8765"):
            refused = client.get("/", headers={"Host": other})
            assert refused.status_code == 400, other
            assert "db" not in refused.get_data(as_text=True)  # no page, no workspace


def test_a_console_on_another_address_answers_any_host(console_ws: ConsoleWorkspace) -> None:
    """The operator chose the network (and was warned): any Host name is served there."""
    for client in console_client(console_ws, host="0.0.0.0"):
        assert client.get("/", headers={"Host": "console.example:8765"}).status_code == 200


def test_refused_host_shows_nothing_of_the_workspace(console_ws: ConsoleWorkspace) -> None:
    for client in console_client(console_ws, table_uri="s3://bucket/table"):
        refused = client.get("/", headers={"Host": "rebound.example:8765"})
        assert refused.status_code == 400
        assert refused.mimetype == "text/plain"
        assert "s3://bucket/table" not in refused.get_data(as_text=True)
        assert csrf_of(client)  # the loopback Host still gets the page

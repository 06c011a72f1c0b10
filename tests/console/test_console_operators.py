"""Named operators and the audit trail (issue 46, item 5), on SQLite and PostgreSQL: tokens made,
listed and revoked through the CLI (the token shown once, only its digest kept); the console
unlocked with an operator's token acts under that name, a read-only operator's is refused, a
revoked token's session ends at its next request; and the trail records an action of each kind
(unlock, a refused unlock, lock, requeue, purge, a key's gate skipped and a key opened, through
the console and the CLI, tokens made and revoked), shown by the console's page and the CLI."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from sqlalchemy import select

from dispatcher.queue.key_lines import SqlKeyLines, Wait
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql.tables import console_tokens
from outbox.app.cli import main
from outbox.app.operators import Audit, Operators
from outbox.core.clock import SystemClock
from tests.console.conftest import ConsoleWorkspace, console_client, csrf_of

SINCE = "2026-01-01T00:00:00+00:00"


def _cli(ws: ConsoleWorkspace, *args: str) -> Any:
    return CliRunner().invoke(main, ["-w", str(ws.path), *args])


def _token(ws: ConsoleWorkspace, name: str, role: str = "operator") -> str:
    r = _cli(ws, "operators", "create", name, "--role", role, "--json")
    assert r.exit_code == 0, r.output
    token: str = json.loads(r.stdout)["token"]
    return token


def _trail(ws: ConsoleWorkspace) -> list[tuple[str, str, str, str]]:
    with SqlQueue(ws.url) as q:
        rows = Audit(q.database, SystemClock()).page(limit=100)
    return [(e.actor, e.action, e.target, e.outcome) for e in reversed(rows)]


@pytest.fixture
def client(console_ws: ConsoleWorkspace) -> Iterator[FlaskClient]:
    yield from console_client(console_ws)


def _unlock(client: FlaskClient, token: str) -> tuple[int, str]:
    csrf = csrf_of(client, "/unlock")
    r = client.post("/unlock", data={"csrf": csrf, "token": token}, follow_redirects=True)
    return r.status_code, r.get_data(as_text=True)


def _requeue(client: FlaskClient, dead_id: int) -> int:
    csrf = csrf_of(client)
    data = {"csrf": csrf, "action": "requeue", "scope": "selected", "id": str(dead_id)}
    return client.post("/dead-letters/apply", data=data).status_code


def test_tokens_are_made_once_listed_and_revoked_through_the_cli(
    console_ws: ConsoleWorkspace,
) -> None:
    made = _cli(console_ws, "operators", "create", "alice")
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert len(token) >= 32
    assert "is not shown again" in made.stderr
    with SqlQueue(console_ws.url) as q, q.database.read("t") as conn:
        [row] = conn.execute(select(console_tokens)).mappings().all()
    assert row["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in json.dumps(dict(row), default=str)  # only the digest is kept

    again = _cli(console_ws, "operators", "create", "alice")
    assert again.exit_code != 0
    assert again.stderr.startswith("error: operator 'alice' already exists")
    bad = _cli(console_ws, "operators", "create", "no spaces")
    assert bad.exit_code != 0
    assert bad.stderr.startswith("error: invalid operator name")

    listed = json.loads(_cli(console_ws, "operators", "list", "--json").stdout)
    assert [(o["name"], o["role"], o["revoked_at"]) for o in listed] == [
        ("alice", "operator", None)
    ]
    assert _cli(console_ws, "operators", "revoke", "alice").exit_code == 0
    gone = _cli(console_ws, "operators", "revoke", "alice")
    assert gone.exit_code != 0
    assert gone.stderr.startswith("error: no active operator 'alice'")
    [alice] = json.loads(_cli(console_ws, "operators", "list", "--json").stdout)
    assert alice["revoked_at"] is not None
    assert [a[1:] for a in _trail(console_ws)] == [
        ("operators.create", "alice", "created (operator)"),
        ("operators.revoke", "alice", "revoked"),
        ("operators.revoke", "alice", "no such active operator"),
    ]
    assert all(a[0].startswith("cli:") for a in _trail(console_ws))


def test_an_operator_acts_under_their_name_and_a_revoked_session_ends(
    client: FlaskClient, console_ws: ConsoleWorkspace
) -> None:
    token = _token(console_ws, "alice")
    status, page = _unlock(client, token)
    assert status == 200
    assert "Unlocked as alice" in page
    assert re.search(r'id="who">alice \(operator\)<', page)
    [ship0] = [i for i, (_q, m) in console_ws.dead.items() if m == "ship-0"]
    assert _requeue(client, ship0) == 302
    assert _trail(console_ws)[-1] == ("alice", "dead-letters.requeue", f"1 dead letters: {ship0}",
                                      "1 requeued")  # fmt: skip

    assert _cli(console_ws, "operators", "revoke", "alice").exit_code == 0
    page = client.get("/dead-letters").get_data(as_text=True)  # the next request ends it
    assert 'id="mode" href="/unlock">locked' in page
    [ship1] = [i for i, (_q, m) in console_ws.dead.items() if m == "ship-1"]
    assert _requeue(client, ship1) == 403
    status, page = _unlock(client, token)  # a revoked token unlocks nothing
    assert status == 403


def test_a_read_only_operator_may_not_act(
    client: FlaskClient, console_ws: ConsoleWorkspace
) -> None:
    token = _token(console_ws, "bob", "read-only")
    status, page = _unlock(client, token)
    assert status == 200
    assert "Unlocked as bob (read-only)" in page
    [ship0] = [i for i, (_q, m) in console_ws.dead.items() if m == "ship-0"]
    csrf = csrf_of(client)
    data = {"csrf": csrf, "action": "purge", "scope": "selected", "id": str(ship0)}
    r = client.post("/dead-letters/apply", data=data)
    assert r.status_code == 403
    assert "This token may not change anything" in r.get_data(as_text=True)
    with SqlQueue(console_ws.url) as q:
        assert q.count_dead_letters(all=True) == 4


def test_the_trail_records_an_action_of_each_kind(
    client: FlaskClient, console_ws: ConsoleWorkspace
) -> None:
    with SqlQueue(console_ws.url) as q:
        SqlKeyLines(q.database).hold(
            [Wait(("shipments", k), f"{k}-doc", "life", 1, f"{k}-1") for k in ("k1", "k2", "k3")],
            "broker down",
            SystemClock().now(),
        )
    token = _token(console_ws, "carol")
    assert _unlock(client, "not-a-token")[0] == 403
    _unlock(client, token)
    ids = {m: i for i, (_q, m) in console_ws.dead.items()}
    assert _requeue(client, ids["ship-0"]) == 302
    csrf = csrf_of(client)
    data = {"csrf": csrf, "action": "purge", "scope": "selected", "id": str(ids["ship-1"])}
    assert client.post("/dead-letters/apply", data=data).status_code == 302
    key = {"csrf": csrf, "destination": "shipments"}
    assert client.post("/keys/apply", data={**key, "how": "skip", "key": "k1", "gate": "k1-1"}
                       ).status_code == 302  # fmt: skip
    assert client.post("/keys/apply", data={**key, "how": "open", "key": "k2", "gate": ""}
                       ).status_code == 302  # fmt: skip
    assert client.post("/lock", data={"csrf": csrf}).status_code == 302
    cli = _cli(console_ws, "keys", "resume", "shipments", "k3", "--open")
    assert cli.exit_code == 0, cli.output
    cli = _cli(console_ws, "dead-letters", "--sql", "requeue", str(ids["inv-0"]))
    assert cli.exit_code == 0, cli.output

    trail = _trail(console_ws)
    kinds = [(who.split(":")[0], what, outcome) for who, what, _on, outcome in trail]
    assert kinds == [
        ("cli", "operators.create", "created (operator)"),
        ("?", "unlock", "refused: no such token"),
        ("carol", "unlock", "unlocked (operator)"),
        ("carol", "dead-letters.requeue", "1 requeued"),
        ("carol", "dead-letters.purge", "1 purged"),
        ("carol", "keys.skip", "skipped the gate"),
        ("carol", "keys.open", "opened"),
        ("carol", "lock", "locked"),
        ("cli", "keys.open", "opened"),
        ("cli", "dead-letters.requeue", "1 requeued"),
    ]
    assert trail[5][2] == "shipments/k1, gate k1-1"

    page = client.get("/audit").get_data(as_text=True)
    actions = re.findall(r'<td class="action">([^<]+)</td>', page)
    assert actions == [k[1] for k in reversed(kinds)]  # newest first
    shown = json.loads(_cli(console_ws, "audit", "--json").stdout)
    assert [e["action"] for e in shown] == actions
    assert set(shown[0]) == {"id", "at", "actor", "action", "target", "outcome"}


def test_the_operators_store_refuses_the_consoles_own_name(console_ws: ConsoleWorkspace) -> None:
    from outbox.core.errors import ValidationError

    with SqlQueue(console_ws.url) as q:
        operators = Operators(q.database, SystemClock())
        with pytest.raises(ValidationError, match="invalid operator name"):
            operators.create("console")
        with pytest.raises(ValidationError, match="invalid role"):
            operators.create("dave", "root")
        assert operators.find("") is None
        assert operators.find(None) is None

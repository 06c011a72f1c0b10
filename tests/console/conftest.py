"""A migrated workspace with dead letters, devices and a history of samples, for the console's
tests (the test client's and the browser's)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from dispatcher.queue import QueueMessage, SqlQueue
from dispatcher.queue.sessions import StateChange
from migrations.sql.tables import samples
from outbox.app import history as H
from outbox.app.cli import main
from outbox.app.console import ConsoleConfig, create_app
from outbox.app.history import History
from outbox.core.clock import SystemClock
from outbox.core.sql import read_only_url
from testkit.browser import RunningConsole, chromium, chromium_available, start_console
from tests.templates import MigratedTemplates

#: The token the tests give the console (``--token`` / ``ConsoleConfig.token``).
TOKEN = "console-test-token-0123456789"


@dataclass
class ConsoleWorkspace:
    path: Path
    url: str
    #: dead letter id -> (queue, message id)
    dead: dict[int, tuple[str, str]]


def dead_letter(queue: SqlQueue, name: str, message_id: str, reason: str, **kw: object) -> int:
    queue.send(name, QueueMessage(body=kw.pop("body", b'{"order": 1}'), message_id=message_id,
                                  **kw))  # type: ignore[arg-type]  # fmt: skip
    [msg] = queue.receive(name, 1, session_id=kw.get("session_id"))  # type: ignore[arg-type]
    queue.dead_letter(msg, reason, f"{reason} while handling {message_id}")
    [d] = queue.list_dead_letters(name, 1, where={"message_id": message_id})
    return d.id


def _migrate(ws: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(ws), "migrate"])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> MigratedTemplates:
    """The console's migrated workspaces, built once a session per database kind and copied
    for each test (a migration was most of a console test's set-up)."""
    return MigratedTemplates(tmp_path_factory.mktemp("console-templates"), _migrate)


@pytest.fixture
def console_ws(
    tmp_path: Path,
    sql_url: str,
    migrated_templates: MigratedTemplates,
    request: pytest.FixtureRequest,
) -> ConsoleWorkspace:
    """On SQLite and on a real PostgreSQL server (the ``sql_url`` fixture)."""
    sqlite = sql_url.startswith("sqlite")
    pg_server = None if sqlite else request.getfixturevalue("pg_server")
    migrated_templates.workspace(tmp_path / "ws", sql_url, pg_server)
    return console_workspace(tmp_path, sql_url, migrated=True)


def console_workspace(tmp_path: Path, sql_url: str, *, migrated: bool = False) -> ConsoleWorkspace:
    """The fixture's workspace, for a caller without fixtures (tests/test_mutations.py);
    ``migrated``: ``tmp_path / "ws"`` is already a migrated workspace on ``sql_url``."""
    ws = tmp_path / "ws"
    if not migrated:
        ws.mkdir()
        (ws / "outbox.toml").write_text(f'sql_url = "{sql_url}"\n')
        _migrate(ws)
    url = sql_url
    dead: dict[int, tuple[str, str]] = {}
    with SqlQueue(url) as queue:
        for i in range(3):
            dead[dead_letter(queue, "shipments", f"ship-{i}", "Poison")] = (
                "shipments",
                f"ship-{i}",
            )
        dead[dead_letter(queue, "invoices", "inv-0", "Timeout")] = ("invoices", "inv-0")
        # two devices: one online with a task out, one offline with a task waiting
        queue.sessions.set_states(
            "devices",
            [StateChange("pump-1", paused=False, state="online"),
             StateChange("pump-2", paused=True, state="offline")],
        )  # fmt: skip
        queue.send("devices", QueueMessage(body=b"{}", message_id="t-1", session_id="pump-1"))
        queue.send("devices", QueueMessage(body=b"{}", message_id="t-2", session_id="pump-2"))
        queue.receive("devices", 1, session_id="pump-1")
        _samples(queue, datetime.now(UTC))
    return ConsoleWorkspace(ws, url, dead)


def _samples(queue: SqlQueue, now: datetime) -> None:
    """Half an hour of the charts' samples, a minute apart: the rows ``History.record`` writes
    for each minute (its slot and columns), in one transaction rather than thirty."""
    rows = [
        {
            "metric": metric,
            "subject": subject,
            "taken_at_s": int(H.slot_start(now - timedelta(minutes=30 - k), 60).timestamp()),
            "value": value,
            "source": "test",
        }
        for k in range(30)
        for metric, subject, value in (
            (H.RESCUE_LAG_SECONDS, "nightly", 20.0 + k),
            (H.RESCUE_LAG_VERSIONS, "nightly", 2.0),
            (H.PENDING_DOCUMENTS, "", 7.0),
            (H.OLDEST_PENDING_AGE, "", 42.0),
        )
    ]
    with queue.database.write("the console tests' samples") as conn:
        conn.execute(samples.insert(), rows)


# --- the console through Flask's test client ----------------------------------------------------

HOST = {"Host": "127.0.0.1:8765"}


def console_client(
    ws: ConsoleWorkspace, *, read_only: bool = False, **kw: Any
) -> Iterator[FlaskClient]:
    """The console's app on ``ws``'s database (``kw``: more of its ``ConsoleConfig``), through
    a test client that sends a loopback Host."""
    url = read_only_url(ws.url) if read_only else ws.url
    with SqlQueue(url) as queue:
        config = ConsoleConfig(
            queue=queue,
            history=History(queue.database),
            clock=kw.pop("clock", SystemClock()),
            token=TOKEN,
            read_only=read_only,
            **kw,
        )
        client = create_app(config).test_client()
        client.environ_base.update({"HTTP_HOST": HOST["Host"]})
        yield client


@pytest.fixture
def client(console_ws: ConsoleWorkspace) -> Iterator[FlaskClient]:
    yield from console_client(console_ws)


def csrf_of(client: FlaskClient, path: str = "/dead-letters") -> str:
    page = client.get(path).get_data(as_text=True)
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def unlock(client: FlaskClient) -> str:
    csrf = csrf_of(client, "/unlock")
    r = client.post("/unlock", data={"csrf": csrf, "token": TOKEN})
    assert r.status_code == 302
    return csrf_of(client)  # unlocking starts a new session with a new CSRF token


def dead_left(ws: ConsoleWorkspace) -> set[str]:
    with SqlQueue(ws.url) as queue:
        return {d.message_id for d in queue.list_dead_letters(None, 100)}


def queued(ws: ConsoleWorkspace, name: str) -> list[str]:
    with SqlQueue(ws.url) as queue:
        return [m.message_id for m in queue.peek(name, 100)]


# --- the console in Chromium (tests/console/test_browser*.py) ------------------------------------


def need_chromium() -> None:
    if chromium_available():
        return
    if os.environ.get("CI"):
        pytest.fail("Chromium is not installed; scripts/test.sh installs it (ensure-chromium.sh)")
    pytest.skip("Chromium is not installed here (scripts/ensure-chromium.sh installs it)")


def quiet(ws: Path) -> None:
    with (ws / "outbox.toml").open("a") as settings:  # the pages show the fixture's data
        settings.write("sample_interval = 0\n")


@pytest.fixture
def console(console_ws: ConsoleWorkspace) -> Iterator[RunningConsole]:
    need_chromium()
    quiet(console_ws.path)
    running = start_console(console_ws.path)
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def module_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium for the module's tests (a start cost each test seconds)."""
    need_chromium()
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(module_browser: Any) -> Any:
    """The module's Chromium as a fresh one is: no cookie (cookies are the host's, whatever
    the port: the last test's console's would be sent to this one's), no cache, no page, the
    first window size (``screenshot`` grows it)."""
    module_browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
    module_browser.execute_cdp_cmd("Network.clearBrowserCache", {})
    module_browser.get("about:blank")
    module_browser.set_window_size(1280, 900)
    assert module_browser.execute_cdp_cmd("Storage.getCookies", {})["cookies"] == []
    return module_browser

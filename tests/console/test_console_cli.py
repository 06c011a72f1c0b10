"""``outbox console`` through the command line: bad input is one line, a stop is clean."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from testkit.browser import start_console


def _migrated(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["-w", str(ws), "migrate"]).exit_code == 0
    return ws


def _one_error_line(result: object) -> str:
    stderr = result.stderr  # type: ignore[attr-defined]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_a_port_in_use_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    ws = _migrated(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["-w", str(ws), "console", "--port", str(port)])
    assert result.exit_code == 1
    line = _one_error_line(result)
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert "(fix: choose another --port (0: any free port))" in line


def test_a_short_token_is_refused(tmp_path: Path) -> None:
    ws = _migrated(tmp_path)
    result = CliRunner().invoke(main, ["-w", str(ws), "console", "--token", "secret"])
    assert result.exit_code == 1
    assert "the console token is too short" in _one_error_line(result)


def test_a_kafka_dead_letter_topic_kafka_refuses_is_one_line(tmp_path: Path) -> None:
    ws = _migrated(tmp_path)
    result = CliRunner().invoke(
        main, ["-w", str(ws), "console", "--port", "0", "--kafka-dead-letters", "no topic!"]
    )
    assert result.exit_code == 1
    assert _one_error_line(result).startswith("error: --kafka-dead-letters 'no topic!' ")


def test_a_workspace_never_migrated_says_to_migrate(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "none"), "console", "--port", "0"])
    assert result.exit_code == 1
    assert "outbox migrate" in _one_error_line(result)


def test_the_console_prints_its_address_and_token_once_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    ws = _migrated(tmp_path)
    (ws / "outbox.toml").write_text("sample_interval = 0\n")
    outbox = str(Path(sys.executable).with_name("outbox"))
    process = subprocess.Popen(
        [outbox, "-w", str(ws), "console", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    address = process.stdout.readline()
    token_line = process.stdout.readline()
    unlock_line = process.stdout.readline()
    unlock = unlock_line.split(" ", 2)[2].strip()
    with urllib.request.urlopen(unlock, timeout=60) as page:  # follows the redirect
        assert page.status == 200
    # /unlock reads %74oken as token (Werkzeug decodes the names): the log must mask it too
    spelled = unlock.replace("?token=", "?%74oken=")
    with urllib.request.urlopen(spelled, timeout=60) as page:
        assert page.status == 200
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert address.startswith("outbox console on http://127.0.0.1:")
    token = token_line.rsplit(" ", 1)[1].strip()
    assert token_line == f"actions need this token (shown once): {token}\n"
    assert len(token) >= 16
    assert unlock_line.startswith("or open http://127.0.0.1:")
    assert token not in out  # once: nothing after the start repeats it
    assert token not in err  # the access log masks it
    # both spellings (the log shows the name decoded)
    assert err.count("GET /unlock?token=*** HTTP/1.1") == 2
    assert err.strip().splitlines()[-1] == "console stopped"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_a_console_on_ipv6_loopback_answers_at_the_address_it_prints(tmp_path: Path) -> None:
    """Werkzeug's trusted hosts cut ``[::1]`` at its first colon: the console answered 400 at
    the address it printed."""
    if not _ipv6_loopback():
        if os.environ.get("CI"):
            pytest.fail("this machine has no IPv6 loopback (::1)")
        pytest.skip("this machine has no IPv6 loopback (::1)")
    ws = _migrated(tmp_path)
    (ws / "outbox.toml").write_text("sample_interval = 0\n")
    console = start_console(ws, "--host", "::1")
    try:
        assert console.url.startswith("http://[::1]:")
        with urllib.request.urlopen(console.url, timeout=60) as page:
            assert page.status == 200
            assert "<title>Overview · outbox console</title>" in page.read().decode()
        assert console.token is not None
        with urllib.request.urlopen(f"{console.url}unlock?token={console.token}", timeout=60) as p:
            assert p.status == 200  # the redirect to the overview, at the same address
            assert p.url == console.url
    finally:
        assert console.stop() == 0


def test_without_flask_the_console_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = _migrated(tmp_path)
    for name in [
        m for m in sys.modules if m == "flask" or m.startswith(("flask.", "outbox.app.console"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flask", None)  # import flask raises ImportError
    result = CliRunner().invoke(main, ["-w", str(ws), "console", "--port", "0"])
    assert result.exit_code == 1
    assert _one_error_line(result) == (
        "error: outbox console needs Flask (flask is not installed) "
        "(fix: pip install 'delta-outbox[console]')"
    )

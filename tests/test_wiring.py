"""``outbox.wiring``: the one place that turns settings into backends (issue 30).

What it promises: every name a backend setting takes is known there (or named in one error with
the known names and the entry point group); a third party's backend, registered by an entry point,
is built like a shipped one; a missing extra names itself; ``Backends`` closes what it built and
never what it was given; and no module outside the package compares a backend setting's value.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

import pytest

from dispatcher.transports.memory import InMemoryTransport
from outbox.core.errors import ConfigurationError, MissingDependencyError
from outbox.core.settings import BACKEND_SETTINGS, Settings
from outbox.wiring import Backend, Backends, Registry, builtin, check
from outbox.wiring import registry as registry_module

REPO = Path(__file__).resolve().parents[1]


def test_every_shipped_backend_is_registered_under_its_setting() -> None:
    assert builtin.TRANSPORTS.names() == ["kafka", "memory", "mqtt", "servicebus", "sql"]
    assert builtin.COMMAND_QUEUES.names() == ["servicebus", "sql"]
    assert builtin.CHECKPOINT_STORES.names() == ["cosmos", "sql"]
    assert builtin.RESCUER_ENGINES.names() == ["local", "spark"]
    assert builtin.CLAIM_LOGS.names() == ["cosmos", "sql"]
    assert builtin.INBOXES.names() == ["cosmos", "sql"]
    assert sorted(r.setting for r in builtin.REGISTRIES) == sorted(BACKEND_SETTINGS)


def test_an_unknown_name_is_one_error_naming_the_setting_and_the_choices(tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path, command_transport="pigeon")
    with pytest.raises(ConfigurationError) as e:
        check(settings)
    assert str(e.value) == (
        "setting 'command_transport' is invalid: 'pigeon' is not a command queue (fix: use one "
        "of servicebus, sql, or install the package that provides it (entry point group "
        "delta_outbox.command_queues))"
    )


def test_a_backend_checks_the_settings_it_needs(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="setting 'mqtt_broker' is missing"):
        check(Settings(workspace=tmp_path, transport="mqtt"))
    with pytest.raises(ConfigurationError, match="inbox_store is cosmos but no endpoint"):
        check(Settings(workspace=tmp_path, inbox_store="cosmos"))


class _EntryPoint:
    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self._value = value

    def load(self) -> Any:
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


def test_a_plugin_registers_a_backend_with_an_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    built: list[Any] = []

    def pigeon(b: Any) -> InMemoryTransport:
        built.append(b.settings.transport)
        return InMemoryTransport()

    plugin = Backend("pigeon", pigeon, description="carrier pigeons")
    groups = {
        "delta_outbox.transports": [
            _EntryPoint("broken", ImportError("no module named pigeons_v0")),
            _EntryPoint("not-a-backend", object()),
            _EntryPoint("pigeon", plugin),
        ]
    }
    monkeypatch.setattr(registry_module, "entry_points", lambda group: groups.get(group, []))
    fresh: Registry[Any] = Registry("transport", "transport", "delta_outbox.transports")
    for name in builtin.TRANSPORTS.names():
        fresh.add(builtin.TRANSPORTS.get(name))
    monkeypatch.setattr(builtin, "TRANSPORTS", fresh)
    monkeypatch.setattr(
        builtin, "REGISTRIES", (fresh, *[r for r in builtin.REGISTRIES if r.kind != "transport"])
    )
    with caplog.at_level(logging.WARNING, logger="outbox.wiring"):
        with Backends(Settings(workspace=tmp_path, transport="pigeon")) as backends:
            assert isinstance(backends.transport(), InMemoryTransport)
        assert built == ["pigeon"]
    assert "pigeon" in fresh.names()
    messages = caplog.text
    assert "'broken'" in messages  # logged, not fatal
    assert "failed to load" in messages
    assert "is not an outbox.wiring.Backend" in messages


def test_a_missing_extra_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def needs_sdk(b: Any) -> Any:
        raise ImportError("No module named 'pigeon_sdk'")

    fresh: Registry[Any] = Registry("transport", "transport", "delta_outbox.transports")
    fresh.add(Backend("sql", builtin.TRANSPORTS.get("sql").build))
    fresh.add(Backend("pigeon", needs_sdk, extra="pigeon"))
    monkeypatch.setattr(builtin, "TRANSPORTS", fresh)
    monkeypatch.setattr(
        builtin, "REGISTRIES", (fresh, *[r for r in builtin.REGISTRIES if r.kind != "transport"])
    )
    with (
        pytest.raises(MissingDependencyError, match=r"pip install 'delta-outbox\[pigeon\]'"),
        Backends(Settings(workspace=tmp_path, transport="pigeon")) as backends,
    ):
        backends.transport()


class _Closing:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_backends_close_what_they_built_and_never_what_they_were_given(tmp_path: Path) -> None:
    given = InMemoryTransport()
    closes: list[str] = []
    given.close = lambda: closes.append("given")  # type: ignore[method-assign]
    from migrations.sql import upgrade

    settings = Settings(workspace=tmp_path, sql_url=f"sqlite:///{tmp_path}/q.db")
    upgrade(settings.sql_url)
    backends = Backends(settings, transport=given)
    assert backends.transport() is given
    queue = backends.sql_queue
    assert backends.command_queue() is queue  # SQL commands share the one SQL queue
    assert backends.command_sink().queue is queue
    real_close = queue.close
    queue.close = lambda: (closes.append("queue"), real_close())  # type: ignore[method-assign]
    backends.close()
    backends.close()  # idempotent
    assert closes == ["queue"]  # the queue once, the given transport never


def test_migrate_runs_the_chosen_backends_provisioning_once_each(tmp_path: Path) -> None:
    assert builtin.provisioners(Settings(workspace=tmp_path)) == []
    both = builtin.provisioners(
        Settings(workspace=tmp_path, transport="servicebus", command_transport="servicebus")
    )
    assert [p.__name__ for p in both] == ["_servicebus_command_queue", "_servicebus_destinations"]
    only_transport = builtin.provisioners(Settings(workspace=tmp_path, transport="servicebus"))
    assert [p.__name__ for p in only_transport] == ["_servicebus_destinations"]


# --- no backend name compared outside outbox.wiring ------------------------------------------


def _compares_a_backend_name(tree: ast.AST) -> list[int]:
    """Lines that compare a backend setting (``x.transport``, ``settings.checkpoint_store``...)
    with a string, or test it for membership in strings."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [s for s in sides if isinstance(s, ast.Attribute) and s.attr in BACKEND_SETTINGS]
        strings = [
            s
            for s in sides
            if (isinstance(s, ast.Constant) and isinstance(s.value, str))
            or (
                isinstance(s, ast.Tuple | ast.List | ast.Set)
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)
            )
        ]
        if names and strings:
            found.append(node.lineno)
    return found


def test_no_module_outside_the_wiring_compares_a_backend_name() -> None:
    offenders = []
    for package in ("outbox", "dispatcher", "rescuer", "migrations"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.is_relative_to(REPO / "outbox" / "wiring"):
                continue
            for line in _compares_a_backend_name(ast.parse(path.read_text())):
                offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert offenders == [], "choose backends in outbox.wiring only"


def test_the_name_scan_finds_a_comparison() -> None:
    code = (
        "if settings.command_transport == 'servicebus': pass\n"
        "if s.checkpoint_store in ('sql', 'cosmos'): pass\n"
        "if settings.transport is not None: pass\n"
    )
    assert _compares_a_backend_name(ast.parse(code)) == [1, 2]

"""``Outbox.open``: the workspace default, explicit settings, and table URIs."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox import ConfigurationError, Outbox, Settings


def test_open_creates_the_workspace_and_dispatches(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    with Outbox.open(ws, transport="memory") as ob, ob.unit_of_work() as uow:
        uow.create("a", type="T").send("E", {"n": 1}, destination="q")
    assert (ws / "documents" / "_delta_log").is_dir()
    assert (ws / "outbox.db").is_file()
    with Outbox.open(ws, transport="memory", create=False) as ob:
        row = ob.store.read(["a"])[1]["a"]
        assert row.dispatched_seq == row.last_seq == 1  # sent right after the commit


def test_open_with_a_table_uri_and_storage_options(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'lake' / 'documents'}"
    with Outbox.open(
        tmp_path / "ws", table_uri=uri, storage_options={}, transport="memory", buckets=4
    ) as ob:
        assert ob.store.uri == uri
        assert ob.store.buckets == 4
        with ob.unit_of_work() as uow:
            uow.create("a", type="T").send("E", {}, destination="q")
    assert (tmp_path / "lake" / "documents" / "_delta_log").is_dir()


def test_open_with_settings_object(tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path / "ws", transport="memory", rescue_delay=60)
    with Outbox.open(settings=settings) as ob:
        assert ob.settings.rescue_delay == 60
        assert ob.settings.table_uri == str((tmp_path / "ws" / "documents").absolute())


def test_open_with_an_invalid_setting_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'rescue_delay' is invalid"):
        Outbox.open(tmp_path / "ws", rescue_delay="2s")
    assert not (tmp_path / "ws").exists()  # nothing was created

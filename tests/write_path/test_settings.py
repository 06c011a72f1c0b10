"""Settings: defaults < TOML file < OUTBOX_* environment < explicit values, validated once."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings


def test_defaults_live_in_the_workspace(tmp_path: Path) -> None:
    s = Settings.load(tmp_path / "ws", env={})
    assert s.table_uri == str((tmp_path / "ws" / "documents").absolute())
    assert s.sql_url == f"sqlite:///{(tmp_path / 'ws' / 'outbox.db').absolute()}"
    assert s.rescue_delay == 15.0
    assert s.dispatch == "immediate"
    assert s.transport == "sql"


def test_layering_file_then_env_then_arguments(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "outbox.toml").write_text(
        '[outbox]\nrescue_delay = "2m"\nbuckets = 8\ndispatch = "deferred"\n'
        'storage_options = { AWS_REGION = "eu-west-1" }\n'
    )
    env = {"OUTBOX_RESCUE_DELAY": "90s", "OUTBOX_MAX_IN_FLIGHT": "4", "UNRELATED": "x"}
    s = Settings.load(ws, env=env)
    assert s.rescue_delay == 90.0  # env beats the file
    assert s.buckets == 8  # from the file
    assert s.dispatch == "deferred"
    assert s.max_in_flight == 4
    assert s.storage_options == {"AWS_REGION": "eu-west-1"}
    s = Settings.load(ws, env=env, rescue_delay="1h")
    assert s.rescue_delay == 3600.0  # an explicit value beats both


def test_a_file_without_a_section_may_hold_the_dict_settings_as_tables(tmp_path: Path) -> None:
    """Settings at the top of the file: a table there is a dict setting (``[storage_options]``),
    and any other table is a misspelt section, never an unknown setting."""
    cfg = tmp_path / "flat.toml"
    cfg.write_text('transport = "memory"\n[storage_options]\nAWS_REGION = "eu-west-1"\n')
    s = Settings.load(tmp_path / "ws", config_file=cfg, env={})
    assert (s.transport, s.storage_options) == ("memory", {"AWS_REGION": "eu-west-1"})
    cfg.write_text('transport = "memory"\n[outbox_settings]\nbuckets = 8\n')
    with pytest.raises(ConfigurationError, match=r"unknown section \[outbox_settings\]"):
        Settings.load(tmp_path / "ws", config_file=cfg, env={})


def test_workspace_from_environment(tmp_path: Path) -> None:
    s = Settings.load(None, env={"OUTBOX_WORKSPACE": str(tmp_path / "elsewhere")})
    assert s.workspace == tmp_path / "elsewhere"


def test_config_file_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "custom.toml"
    cfg.write_text(f'workspace = "{tmp_path / "w2"}"\ntransport = "memory"\n')
    s = Settings.load(None, env={"OUTBOX_CONFIG": str(cfg)})
    assert s.workspace == tmp_path / "w2"
    assert s.transport == "memory"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rescue_delay": "5s"}, "'rescue_delay' is invalid: 5s is outside 15s..1h"),
        ({"rescue_delay": "2h"}, "'rescue_delay' is invalid"),
        ({"rescue_delay": "soon"}, "'rescue_delay' has an invalid value 'soon'"),
        ({"transport": ""}, "'transport' is invalid: must name a backend"),
        ({"dispatch": "later"}, "'dispatch' is invalid"),
        ({"buckets": 0}, "'buckets' is invalid"),
        ({"buckets": "many"}, "'buckets' has an invalid value"),
        ({"max_in_flight": -1}, "'max_in_flight' is invalid"),
        ({"lock_duration": "10m"}, "'lock_duration' is invalid"),
        ({"sql_url": "outbox.db"}, "'sql_url' is invalid"),
        ({"colour": "blue"}, "unknown setting 'colour'"),
    ],
)
def test_invalid_settings_name_the_setting(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Settings.load(tmp_path, env={}, **overrides)


def test_invalid_settings_file(tmp_path: Path) -> None:
    (tmp_path / "outbox.toml").write_text("rescue_delay = [")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        Settings.load(tmp_path, env={})
    with pytest.raises(ConfigurationError, match="does not exist"):
        Settings.load(tmp_path, env={}, config_file=tmp_path / "missing.toml")


def test_invalid_environment_value_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'buckets' has an invalid value 'lots'"):
        Settings.load(tmp_path, env={"OUTBOX_BUCKETS": "lots"})


def test_secrets_are_not_printed(tmp_path: Path) -> None:
    s = Settings.load(tmp_path, env={}, storage_options={"AZURE_STORAGE_ACCOUNT_KEY": "s3cr3t"})
    assert "s3cr3t" not in str(s.to_dict())

"""Backends own their settings (issue 43, item 3): a section of the file (``[kafka]``) and the
variables ``OUTBOX_<SECTION>_<KEY>``, layered like the core settings; the flat names of before
keep working in a file with a one-line deprecation notice, and as attributes; a section's unknown
key gets the same did-you-mean as an unknown setting; no two spellings can mean two things."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outbox.core import settings_sections
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings
from outbox.core.settings_backends import (
    SHIPPED,
    CosmosOptions,
    KafkaOptions,
    MqttOptions,
    ServiceBusOptions,
)
from outbox.core.settings_sections import SECTIONS, BackendOptions, SectionRegistry
from outbox.core.settings_values import setting
from tests.workspaces import dispatched_workspace

OUTBOX = str(Path(sys.executable).with_name("outbox"))


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the notices its own loads log (they are logged once per process)."""
    monkeypatch.setattr(settings_sections, "_noticed", set())


def _toml(ws: Path, text: str) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "outbox.toml").write_text(text)
    return ws


def test_a_backend_reads_its_section_and_its_variables(tmp_path: Path) -> None:
    ws = _toml(
        tmp_path / "ws",
        '[outbox]\ntransport = "kafka"\n'
        '[kafka]\nbootstrap_servers = "b1:9092"\nsend_timeout = "10s"\npartitions = 3\n'
        '[kafka.options]\n"ssl.ca.location" = "/ca.pem"\n'
        '[cosmos]\nendpoint = "https://acct.documents.azure.com:443/"\n',
    )
    env = {"OUTBOX_KAFKA_SEND_TIMEOUT": "20s", "OUTBOX_MQTT_BROKER": "mqtt://m:1883"}
    s = Settings.load(ws, env=env)
    kafka = s.options(KafkaOptions)
    assert isinstance(kafka, KafkaOptions)
    assert kafka.bootstrap_servers == "b1:9092"  # the file
    assert kafka.send_timeout == 20.0  # a variable overrides one key of the file's table
    assert kafka.partitions == 3  # ... and leaves the others
    assert kafka.options == {"ssl.ca.location": "/ca.pem"}
    assert s.options(CosmosOptions).endpoint == "https://acct.documents.azure.com:443/"
    assert s.options(MqttOptions).broker == "mqtt://m:1883"
    s = Settings.load(ws, env=env, kafka={"partitions": 6})  # an argument beats both, per key
    assert (s.options(KafkaOptions).partitions, s.options(KafkaOptions).send_timeout) == (6, 20.0)


def test_a_file_with_settings_at_the_top_may_hold_sections(tmp_path: Path) -> None:
    cfg = tmp_path / "flat.toml"
    cfg.write_text('transport = "memory"\n[servicebus]\ndestinations = ["a", "topic:b"]\n')
    s = Settings.load(tmp_path / "ws", config_file=cfg, env={})
    assert s.options(ServiceBusOptions).destinations == ("a", "topic:b")
    assert s.declared_destinations == {"a", "b"}


def test_the_flat_names_still_work_as_arguments_and_attributes(tmp_path: Path) -> None:
    s = Settings(workspace=tmp_path, kafka_bootstrap_servers="h:9092", cosmos_key="k")
    assert s.options(KafkaOptions).bootstrap_servers == s.kafka_bootstrap_servers == "h:9092"
    s = s.replace(kafka_partitions=4, servicebus_destinations="q1,topic:t1")
    assert (s.kafka_partitions, s.kafka_bootstrap_servers) == (4, "h:9092")
    assert s.servicebus_destinations == ("q1", "topic:t1")
    assert s.cosmos_key == "k"
    assert Settings(kafka=KafkaOptions(partitions=2)).kafka_partitions == 2
    assert Settings(kafka={"partitions": "2"}).kafka_partitions == 2
    again = pickle.loads(pickle.dumps(s))  # settings travel to Spark executors and processes
    assert again == s
    assert again.kafka_partitions == 4


def test_every_key_of_a_flat_section_has_its_attribute() -> None:
    """The views in ``settings_flat`` are written by hand (for mypy): none may be missing."""
    s = Settings()
    for options in SHIPPED:
        assert options.FLAT
        for key in options.option_fields():
            name = options.setting_name(key)
            assert getattr(s, name) == getattr(s.options(options), key), name


def test_a_flat_name_in_a_file_logs_one_notice_naming_the_new_spelling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ws = _toml(
        tmp_path / "ws", '[outbox]\nkafka_send_timeout = "10s"\nmqtt_topic = "t/{destination}"\n'
    )
    with caplog.at_level(logging.WARNING, logger="outbox.settings"):
        s = Settings.load(ws, env={})
        Settings.load(ws, env={})  # once per process, not per load
    assert s.options(KafkaOptions).send_timeout == 10.0
    assert s.mqtt_topic == "t/{destination}"
    assert [r.getMessage() for r in caplog.records] == [
        f"settings file {ws}/outbox.toml: 'kafka_send_timeout' is deprecated: write send_timeout "
        "under [kafka] (the variable OUTBOX_KAFKA_SEND_TIMEOUT is unchanged)",
        f"settings file {ws}/outbox.toml: 'mqtt_topic' is deprecated: write topic under [mqtt] "
        "(the variable OUTBOX_MQTT_TOPIC is unchanged)",
    ]


def test_variables_and_arguments_of_flat_names_log_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``OUTBOX_KAFKA_SEND_TIMEOUT`` is the new spelling already; the flat keywords are the
    Python API's compatible spelling."""
    with caplog.at_level(logging.WARNING, logger="outbox.settings"):
        s = Settings.load(
            tmp_path, env={"OUTBOX_KAFKA_SEND_TIMEOUT": "10s"}, kafka_bootstrap_servers="h:1"
        )
    assert (s.kafka_send_timeout, s.kafka_bootstrap_servers) == (10.0, "h:1")
    assert caplog.records == []


def test_one_key_given_both_ways_in_one_file_is_an_error(tmp_path: Path) -> None:
    ws = _toml(
        tmp_path / "ws",
        "[outbox]\nkafka_partitions = 3\n[kafka]\npartitions = 4\n",
    )
    with pytest.raises(ConfigurationError) as e:
        Settings.load(ws, env={})
    assert str(e.value) == (
        "setting 'kafka_partitions' is given twice, as kafka_partitions and as partitions under "
        "[kafka] (fix: keep the one under [kafka])"
    )


def test_an_unknown_key_in_a_section_gets_a_did_you_mean(tmp_path: Path) -> None:
    ws = _toml(tmp_path / "ws", '[outbox]\ntransport = "kafka"\n[kafka]\nbootstrap_server = "h"\n')
    with pytest.raises(ConfigurationError) as e:
        Settings.load(ws, env={})
    assert str(e.value) == (
        "unknown setting 'bootstrap_server' in [kafka] (did you mean 'bootstrap_servers'?) (fix: "
        "known [kafka] settings: bootstrap_servers, connection_string, options, partitions, "
        "sasl_mechanism, sasl_password, sasl_username, security_protocol, send_timeout)"
    )


def test_a_misspelt_section_is_an_error_and_another_tools_table_is_not(tmp_path: Path) -> None:
    ws = _toml(tmp_path / "ws", '[outbox]\nbuckets = 8\n[kafak]\nbootstrap_servers = "h"\n')
    with pytest.raises(
        ConfigurationError, match=r"unknown section \[kafak\] \(did you mean 'kafka'"
    ):
        Settings.load(ws, env={})
    _toml(ws, "[outbox]\nbuckets = 8\n[tool.other]\nx = 1\n")  # a shared file: left alone
    assert Settings.load(ws, env={}).buckets == 8


def test_a_sections_values_are_checked_and_named_by_their_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as e:
        Settings.load(tmp_path, env={"OUTBOX_KAFKA_SEND_TIMEOUT": "20m"})
    assert str(e.value) == "setting 'kafka_send_timeout' is invalid: 1200s; must be in (0s, 10m]"
    with pytest.raises(ConfigurationError, match="'kafka_partitions' has an invalid value 'many'"):
        Settings.load(tmp_path, env={}, kafka={"partitions": "many"})
    with pytest.raises(ConfigurationError, match=r"setting \[kafka\] must be a table"):
        Settings.load(tmp_path, env={}, kafka="h:9092")


def test_a_misspelt_section_variable_is_warned_with_its_spelling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.core import settings_sources

    monkeypatch.setattr(settings_sources, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="outbox.settings"):
        Settings.load(tmp_path, env={"OUTBOX_KAFKA_BOOTSTRAP_SERVER": "h:1"})
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring the environment variable OUTBOX_KAFKA_BOOTSTRAP_SERVER: no setting has that "
        "name (did you mean 'OUTBOX_KAFKA_BOOTSTRAP_SERVERS'?)"
    ]


def test_secrets_of_sections_are_not_printed() -> None:
    s = Settings(
        kafka={"sasl_password": "pw-1", "options": {"sasl.oauthbearer.config": "pw-2"}},
        cosmos={"key": "pw-3"},
        mqtt={"broker": "mqtt://u:pw-4@h:1883"},
    )
    printed = str(s.to_dict()) + repr(s)
    assert not [pw for pw in ("pw-1", "pw-2", "pw-3", "pw-4") if pw in printed]
    assert s.to_dict()["kafka_sasl_password"] == "***"
    assert s.to_dict()["kafka_sasl_username"] == ""


# --- the naming scheme stays unambiguous -------------------------------------------------------


def _options(section: str, **fields: Any) -> type[BackendOptions]:
    made = dataclasses.make_dataclass(
        f"{section.title()}Options",
        [(k, type(v), setting(v, "doc")) for k, v in (fields or {"colour": "blue"}).items()],
        bases=(BackendOptions,),
        frozen=True,
    )
    made.SECTION = section
    return made


@pytest.mark.parametrize(
    ("section", "fields", "problem"),
    [
        ("toy_box", {}, "must be lowercase letters and digits, without '_'"),
        ("buckets", {}, "has the name of a setting"),
        ("outbox", {}, "has the name of a setting"),
        ("rescue", {"delay": 1.0}, "would be read from OUTBOX_RESCUE_DELAY"),
        ("delta", {"jars": ""}, "would be read from OUTBOX_DELTA_JARS"),
        ("servicebus", {"connection_string": ""}, "declared twice"),
        ("gateway", {"port": 1}, "would be read from OUTBOX_GATEWAY_PORT"),
    ],
)
def test_a_section_that_would_make_a_name_ambiguous_is_refused(
    section: str, fields: dict[str, Any], problem: str
) -> None:
    fresh = SectionRegistry()
    fresh.reserve(
        [f.name for f in dataclasses.fields(Settings) if f.name != "sections"],
        ["OUTBOX_DELTA_JARS", "OUTBOX_SERVICEBUS_CONNECTION_STRING"],
        ("OUTBOX_GATEWAY_",),
    )
    fresh.add(ServiceBusOptions)
    with pytest.raises(ConfigurationError, match=problem.replace("(", r"\(")):
        fresh.add(_options(section, **fields))
    assert fresh.add(ServiceBusOptions) is ServiceBusOptions  # the same type again: no-op


def test_the_shipped_sections_hold_the_names_that_were_flat_settings() -> None:
    """Every old flat name is a key of a shipped section, so none was lost or renamed."""
    before = {
        "cosmos_endpoint", "cosmos_key", "cosmos_database", "cosmos_checkpoint_container",
        "cosmos_inbox_container", "cosmos_claims_container", "kafka_bootstrap_servers",
        "kafka_connection_string", "kafka_security_protocol", "kafka_sasl_mechanism",
        "kafka_sasl_username", "kafka_sasl_password", "kafka_send_timeout", "kafka_partitions",
        "kafka_options", "servicebus_destinations", "mqtt_broker", "mqtt_topic",
    }  # fmt: skip
    now = {o.setting_name(k) for o in SHIPPED for k in o.option_fields()}
    assert now == before
    assert [o.SECTION for o in SECTIONS if o in SHIPPED] == [
        "cosmos",
        "kafka",
        "servicebus",
        "mqtt",
    ]


# --- through the CLI: what a user's terminal shows ----------------------------------------------


def test_the_cli_prints_the_deprecation_notice_as_one_line(tmp_path: Path) -> None:
    ws = dispatched_workspace(tmp_path / "ws")
    (ws / "outbox.toml").write_text('[outbox]\nkafka_send_timeout = "10s"\n')
    result = subprocess.run(
        [OUTBOX, "-q", "-w", str(ws), "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [ln.split(" ", 2)[2] for ln in result.stderr.splitlines()] == [
        f"WARNING outbox.settings: settings file {ws}/outbox.toml: 'kafka_send_timeout' is "
        "deprecated: write send_timeout under [kafka] (the variable OUTBOX_KAFKA_SEND_TIMEOUT is "
        "unchanged)"
    ]


def test_the_cli_names_a_misspelt_key_of_a_section_in_one_line(tmp_path: Path) -> None:
    ws = dispatched_workspace(tmp_path / "ws")
    (ws / "outbox.toml").write_text('[outbox]\ntransport = "memory"\n[mqtt]\ntopc = "t"\n')
    result = subprocess.run(
        [OUTBOX, "-w", str(ws), "status"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: unknown setting 'topc' in [mqtt] (did you mean 'topic'?) (fix: known [mqtt] "
        "settings: broker, topic)"
    )

"""The MQTT tests' broker: a real mosquitto on 127.0.0.1 (or the one in OUTBOX_TEST_MQTT_URL)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.mqtt.broker import MosquittoServer

try:
    import paho.mqtt  # noqa: F401
except ImportError:  # under CI the test modules' own imports fail loudly instead
    if not os.environ.get("CI"):
        collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def mosquitto() -> Iterator[MosquittoServer | str]:
    """One broker for the session; missing mosquitto fails under CI and skips elsewhere."""
    external = os.environ.get("OUTBOX_TEST_MQTT_URL")
    if external:
        yield external
        return
    try:
        import paho.mqtt  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("paho-mqtt is not installed; scripts/setup.sh --dev installs it")
        pytest.skip("paho-mqtt is not installed (pip install 'delta-outbox[mqtt]')")
    server = MosquittoServer()
    if not server.available:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is not installed; scripts/test.sh installs it")
        pytest.skip("mosquitto is not installed here (scripts/ensure-mosquitto.sh installs it)")
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def mqtt_url(mosquitto: MosquittoServer | str) -> str:
    return mosquitto if isinstance(mosquitto, str) else mosquitto.url

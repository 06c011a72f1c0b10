"""Bad arguments and a malformed OUTBOX_CRASH_AT raise errors of our tree (review item 9)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.dispatch import Dispatcher
from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError, ValidationError
from outbox.testing.crash_points import ENV_VAR, CrashPoints


def test_bad_worker_arguments_are_validation_errors(workspace: Path, clock: ManualClock) -> None:
    with Outbox.open(workspace, clock=clock, transport=InMemoryTransport()) as ob:
        with pytest.raises(ValidationError, match="concurrency"):
            DispatcherWorker(ob.runtime, concurrency=0)
        with pytest.raises(ValidationError, match="batch_size"):
            DispatcherWorker(ob.runtime, batch_size=0)


def test_bad_dispatcher_arguments_are_validation_errors() -> None:
    with pytest.raises(ValidationError, match="max_in_flight"):
        Dispatcher(None, InMemoryTransport(), max_in_flight=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec", ["nowhere", "after_send@x", "after_send=explode", "mid_batch=kill_soon:z"]
)
def test_a_malformed_crash_spec_is_a_configuration_error_at_first_use(spec: str) -> None:
    points = CrashPoints(from_env=True)
    with pytest.raises(ConfigurationError, match=ENV_VAR):
        points.arm_from_env({ENV_VAR: spec})


def test_the_process_registry_reads_the_variable_only_when_used() -> None:
    code = (
        "import outbox.testing.crash_points as c\n"  # importing must not fail
        "try:\n"
        "    c.crash_points.hit('after_send')\n"
        "except c.ConfigurationError as e:\n"
        "    print('ConfigurationError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={ENV_VAR: "bogus"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.startswith("ConfigurationError OUTBOX_CRASH_AT='bogus' is malformed")

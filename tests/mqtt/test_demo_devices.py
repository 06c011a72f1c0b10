"""``outbox demo devices``: the door-terminal story runs, holds its invariants and says so."""

from __future__ import annotations

import json

from click.testing import CliRunner

from outbox.app.cli import main
from outbox.testing.mosquitto import MosquittoServer


def test_the_devices_demo_holds_its_invariants(mosquitto: MosquittoServer | str) -> None:
    result = CliRunner().invoke(main, ["demo", "devices", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["ok"] is True
    assert report["published_while_offline"] == 0, "nothing went to the offline device"
    assert report["queued_behind_while_offline"] == 3, "its tasks waited for it"
    assert report["max_in_flight"] == 1
    assert report["devices_in_order"] == report["devices"]

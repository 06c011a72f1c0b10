"""``transport = "mqtt"`` in the settings: the outbox publishes to the broker after the commit,
and a broker that is down stops neither ``Outbox.open`` nor the commit (the send is retried)."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

from outbox.app.facade import Outbox
from tests.mqtt.recorder import Recorder


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_outbox_publishes_to_the_broker_named_in_the_settings(
    tmp_path: Path, mqtt_url: str
) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    rec = Recorder(mqtt_url, f"{prefix}/#")
    try:
        with Outbox.open(
            tmp_path / "ws",
            transport="mqtt",
            mqtt_broker=mqtt_url,
            mqtt_topic=f"{prefix}/{{destination}}/{{session}}",
            default_destination="doors",
        ) as ob:
            with ob.unit_of_work() as uow:
                doc = uow.create("door-7", type="Door", state={"open": False})
                doc.send("Open", {"seq": 1})
                doc.send("Close", {"seq": 2})
            assert ob.store.scan_pending().num_rows == 0  # both settled on PUBACK
            transport = ob.runtime.transport
            rec.fence(transport.connection, f"{prefix}/doors/door-7")  # type: ignore[attr-defined]
        bodies = [json.loads(m.payload) for m in rec.messages if m.topic.endswith("door-7")]
        assert [b["seq"] for b in bodies if "seq" in b] == [1, 2]
    finally:
        rec.close()


def test_a_broker_that_is_down_stops_neither_open_nor_the_commit(tmp_path: Path) -> None:
    url = f"mqtt://127.0.0.1:{_closed_port()}"
    with Outbox.open(
        tmp_path / "ws", transport="mqtt", mqtt_broker=url, default_destination="doors"
    ) as ob:
        with ob.unit_of_work() as uow:
            uow.create("door-8", type="Door").send("Open", {"seq": 1}, ordering_key="door-8")
        assert ob.store.read(["door-8"])[1]["door-8"].version == 1  # committed
        assert ob.store.scan_pending().num_rows == 1  # not sent: the retry command has it
        assert ob.runtime.metrics["send_failures"] >= 1

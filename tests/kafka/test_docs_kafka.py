"""docs/kafka.md's Python blocks run against the real broker (executable documentation)."""

from __future__ import annotations

import re
from pathlib import Path

from dispatcher.kafka.transport import KafkaTransport
from dispatcher.queue.sql_queue import SqlQueue
from dispatcher.transports.base import TransportMessage
from migrations.sql import upgrade
from testkit.kafka import KafkaBroker

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka.md"


def test_the_guides_python_blocks_run(tmp_path: Path, kafka: KafkaBroker, topic: str) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    kafka.create_topic(f"{topic}.dlt")  # as outbox migrate makes it: the consumer needs it
    t = KafkaTransport(kafka.bootstrap)
    t.send([TransportMessage(message_id="m-1", destination=topic, body=b"{}", session_id="k")])
    t.close()
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    upgrade(url)
    queue = SqlQueue(url)
    namespace: dict[str, object] = {"BOOTSTRAP": kafka.bootstrap, "TOPIC": topic, "queue": queue}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/kafka.md python block {i + 1}", "exec"), namespace)
    finally:
        queue.close()
    assert namespace["seen"] == ["m-1"]

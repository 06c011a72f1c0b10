"""``transport = "kafka"`` in the settings, end to end: the outbox sends after the commit, the
consumer helper reads it once; ``outbox migrate`` creates the declared topics; and each bad
input of the issue (an unreachable broker, an unknown topic, a message over the broker's limit, a
failed login) is one line from ``outbox run-dispatcher`` with the messages kept pending."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dispatcher.kafka.config import KafkaConfig
from dispatcher.kafka.consumer import KafkaConsumer
from dispatcher.kafka.mapping import record_of
from dispatcher.queue.inbox import SqlInbox
from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock
from testkit.kafka import PASSWORD, USER, KafkaBroker, read_records

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_outbox_sends_to_kafka_after_the_commit_and_a_consumer_gets_each_once(
    tmp_path: Path, kafka: KafkaBroker, topic: str
) -> None:
    with Outbox.open(
        tmp_path / "ws",
        transport="kafka",
        kafka_bootstrap_servers=kafka.bootstrap,
        default_destination=topic,
    ) as ob:
        for n in range(3):
            with ob.unit_of_work() as uow:
                doc = uow.create(f"order-{n}", type="Order", state={"n": n})
                doc.send("OrderPlaced", {"n": n}, headers={"tenant": "t1"})
                doc.send("OrderPaid", {"n": n})
        assert ob.store.scan_pending().num_rows == 0  # settled on the broker's acks
        records = [record_of(r) for r in read_records(kafka.bootstrap, topic)]
        assert len(records) == 6
        for n in range(3):
            mine = [r for r in records if r.session_id == f"order-{n}"]
            assert [r.subject for r in mine] == ["OrderPlaced", "OrderPaid"]
            assert mine[0].headers["tenant"] == "t1"
        seen: list[str] = []
        kafka.create_topic(f"{topic}.dlt")  # the consumer needs it to start
        group = f"g-{uuid.uuid4().hex[:6]}"
        inbox = SqlInbox(ob.runtime.queue.database, group)  # type: ignore[attr-defined]
        c = KafkaConsumer(
            KafkaConfig(kafka.bootstrap),
            [topic],
            group,
            lambda m: seen.append(json.loads(m.body)["n"]),
            inbox=inbox,
            clock=ManualClock(),
        )
        for _ in range(120):
            c.run_once(0.5)
            if len(seen) == 6:
                break
        c.close()
        assert sorted(seen) == [0, 0, 1, 1, 2, 2]


def _env(ws: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update({"OUTBOX_WORKSPACE": str(ws), "OUTBOX_TRANSPORT": "kafka"})
    env.update({f"OUTBOX_{k.upper()}": v for k, v in settings.items()})
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OUTBOX, *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_outbox_migrate_creates_the_declared_topics_and_their_dead_letter_topics(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    names = [f"m-{uuid.uuid4().hex[:8]}", f"m-{uuid.uuid4().hex[:8]}"]
    older = kafka.create_topic(f"m-{uuid.uuid4().hex[:8]}", 2)  # declared before, without a DLT
    env = _env(
        tmp_path / "ws",
        kafka_bootstrap_servers=kafka.bootstrap,
        destinations=",".join([*names, older]),
        kafka_partitions="3",
    )
    first = _run(env, "migrate")
    assert first.returncode == 0, first.stderr
    lines = [ln.strip().removeprefix("- ") for ln in first.stdout.splitlines()]
    created = [ln for ln in lines if ln.startswith("created Kafka topic")]
    assert created == [
        *(f"created Kafka topic {t}" for n in names for t in (n, f"{n}.dlt")),
        f"created Kafka topic {older}.dlt",
    ], first.stdout
    topics = kafka.admin().list_topics(timeout=30).topics
    assert all(len(topics[t].partitions) == 3 for n in names for t in (n, f"{n}.dlt"))
    assert len(topics[f"{older}.dlt"].partitions) == 2, "a dead-letter topic is as its topic"
    again = _run(env, "migrate")
    assert again.returncode == 0, again.stderr
    assert "created Kafka topic" not in again.stdout


def _bad_input_cases(kafka: KafkaBroker) -> dict[str, tuple[dict[str, str], str, str]]:
    small = kafka.create_topic(f"small-{uuid.uuid4().hex[:8]}", 1, {"max.message.bytes": "20000"})
    ok = kafka.create_topic(f"ok-{uuid.uuid4().hex[:8]}", 1)
    return {
        "unreachable broker": (
            {
                "kafka_bootstrap_servers": f"127.0.0.1:{_closed_port()}",
                "kafka_send_timeout": "2s",
            },
            ok,
            "could not reach Kafka at 127.0.0.1:",
        ),
        "unknown topic": (
            {"kafka_bootstrap_servers": kafka.bootstrap},
            "no-such-topic",
            "has no topic 'no-such-topic' (and does not create topics on use)",
        ),
        "over the size limit": (
            {"kafka_bootstrap_servers": kafka.bootstrap, "max_message_bytes": "1000000"},
            small,
            "refused it: Broker: Message size too large",
        ),
        "failed login": (
            {
                "kafka_bootstrap_servers": kafka.sasl_bootstrap,
                "kafka_security_protocol": "SASL_PLAINTEXT",
                "kafka_sasl_username": USER,
                "kafka_sasl_password": PASSWORD + "-typo",
            },
            ok,
            "did not accept the login: ",
        ),
    }


@pytest.mark.parametrize(
    "case", ["unreachable broker", "unknown topic", "over the size limit", "failed login"]
)
def test_bad_input_is_one_line_and_the_messages_stay_pending(
    tmp_path: Path, kafka: KafkaBroker, case: str
) -> None:
    settings, destination, line = _bad_input_cases(kafka)[case]
    ws = tmp_path / "ws"
    env = _env(ws, dispatch="deferred", **settings)
    body = {"blob": "x" * 30_000} if case == "over the size limit" else {"n": 1}
    with (
        Outbox.open(
            ws,
            transport="kafka",
            dispatch="deferred",
            max_message_bytes=1_000_000,
            kafka_bootstrap_servers=settings["kafka_bootstrap_servers"],
        ) as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("order-1", type="Order").send("OrderPlaced", body, destination=destination)
    done = _run(env, "run-dispatcher", "--once")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    failures = [ln for ln in done.stderr.splitlines() if "send of seq 1..1 failed" in ln]
    assert len(failures) == 1, done.stderr
    assert line in failures[0]
    assert "fix: " in failures[0]
    assert done.stderr.strip().splitlines()[-1].startswith("error: 1 of 1 command(s)")
    with Outbox.open(ws, transport="memory") as ob:
        assert ob.store.scan_pending().num_rows == 1, "nothing is lost"

"""A throwaway one-node Apache Kafka broker (KRaft mode) for the tests and benchmarks.

Why: a Kafka transport is only believable against a real broker, and starting one right (free
ports on 127.0.0.1 only, a formatted log folder, a readiness check, a SASL listener to test logins
against, a kill and restart on the same ports) is the same chore for every test and benchmark.
``scripts/fetch-kafka.sh`` puts the broker's JARs under ``.cache/kafka/libs`` (Maven Central);
``OUTBOX_KAFKA_LIBS`` points elsewhere. It needs Java 17 or newer.

Two listeners: PLAINTEXT on ``port`` (``bootstrap``) and SASL_PLAINTEXT with PLAIN on
``sasl_port`` (user ``USER`` / ``PASSWORD``). Topics are not created on use.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatcher.kafka.reading import end_offsets, read_records
from dispatcher.kafka.topics import wait_until_listed
from outbox.testing.servers import free_port, stop_process

__all__ = ["PASSWORD", "USER", "KafkaBroker", "end_offsets", "kafka_libs", "read_records"]

#: The SASL listener's one account.
USER = "outbox"
PASSWORD = "outbox-secret"
_CLUSTER_ID = "b3V0Ym94LWthZmthLXQx"  # any 22 URL-safe base64 characters


def kafka_libs() -> Path | None:
    """The folder of the broker's JARs, or None when it is not there."""
    configured = os.environ.get("OUTBOX_KAFKA_LIBS")
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[1] / ".cache" / "kafka" / "libs")
    for folder in candidates:
        if any(folder.glob("kafka_2.13-*.jar")):
            return folder
    return None


_LOG4J = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {dir}/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


class KafkaBroker:
    """One broker and controller in one JVM, on free ports of 127.0.0.1."""

    def __init__(
        self, *, heap: str = "512m", extra: dict[str, str] | None = None, quick_start: bool = True
    ) -> None:
        """``quick_start``: the JVM compiles with C1 only (ready in about 2 s instead of 5 to 9
        s, for tests); a benchmark turns it off so the broker reaches its full speed."""
        self.libs = kafka_libs()
        self.heap = heap
        self.quick_start = quick_start
        self.extra = extra or {}
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-kafka-"))
        self.port = free_port()
        self.sasl_port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._formatted = False

    @property
    def available(self) -> bool:
        return self.libs is not None and shutil.which("java") is not None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    def _properties(self) -> str:
        jaas = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{USER}" password="{PASSWORD}" user_{USER}="{PASSWORD}";'
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "4",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.flush.interval.messages": "9223372036854775807",
        }
        props.update(self.extra)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main: str, *args: str) -> list[str]:
        assert self.libs is not None
        return [
            "java",
            f"-Xmx{self.heap}",
            *(("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1") if self.quick_start else ()),
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            "-cp",
            f"{self.libs}/*",
            main,
            *args,
        ]

    def start(self, timeout: float = 90.0) -> str:
        """Formats the log folder once, starts the broker and waits until it answers a
        metadata request; returns the bootstrap servers."""
        if not self.available:
            raise RuntimeError(
                "the Kafka broker's JARs or Java are missing; run scripts/fetch-kafka.sh"
            )
        config = self.dir / "server.properties"
        config.write_text(self._properties())
        (self.dir / "log4j2.properties").write_text(
            _LOG4J.format(dir=self.dir, level=os.environ.get("OUTBOX_KAFKA_LOG_LEVEL", "info"))
        )
        if not self._formatted:
            subprocess.run(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", _CLUSTER_ID, "-c", str(config)
                ),
                check=True,
                capture_output=True,
            )
            self._formatted = True
        out = (self.dir / "stdout.log").open("ab")
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self._wait_ready(timeout)
        return self.bootstrap

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited at start:\n{self.log_tail()}")
            try:
                meta = admin.list_topics(timeout=1.0)
                if meta.brokers:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the Kafka broker did not answer within {timeout:g}s:\n{self.log_tail()}"
                )

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for name in ("stdout.log", "broker.log"):
            path = self.dir / name
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def create_topic(
        self, name: str, partitions: int = 4, config: dict[str, str] | None = None
    ) -> str:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self.admin()  # held until the result: a collected client cancels its requests
        futures = admin.create_topics(
            [NewTopic(name, partitions, 1, config=config or {})], operation_timeout=30
        )
        futures[name].result(timeout=60)
        wait_until_listed(admin, [name], 60)  # listed by the broker too, not only created
        return name

    def kill(self) -> None:
        """SIGKILL, as a crash: the log folder stays, ``start`` brings it back."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        stop_process(self.process, timeout=20)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

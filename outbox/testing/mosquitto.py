"""A throwaway mosquitto broker (Debian's ``mosquitto`` package) for tests, benchmarks and
``outbox demo devices``.

Why in the kit: a gateway or an MQTT transport is only believable against a real broker, and
starting one right (a free port on 127.0.0.1 only, no persistence, a readiness check, a restart
on the same port) is the same chore for every user. ``scripts/ensure-mosquitto.sh`` installs the
package; ``available`` says whether it is there. ``stop`` then ``start`` simulates a broker
restart (no persistence: subscriptions and queued messages are gone).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from outbox.testing.servers import free_port, stop_process


def mosquitto_binary() -> str | None:
    for candidate in ("/usr/sbin/mosquitto", shutil.which("mosquitto")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class MosquittoServer:
    def __init__(self, extra_config: tuple[str, ...] = ()) -> None:
        """``extra_config``: more mosquitto.conf lines; ``{dir}`` is the broker's own folder."""
        self.extra_config = extra_config
        self.binary = mosquitto_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-mqtt-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def available(self) -> bool:
        return self.binary is not None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> str:
        assert self.binary is not None
        config = self.dir / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence false",
            "max_inflight_messages 0",
            "max_queued_messages 100000",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
        ]
        lines += [line.replace("{dir}", str(self.dir)) for line in self.extra_config]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to a 'mosquitto' user that may not exist
        config.write_text("\n".join(lines) + "\n")
        log = (self.dir / "mosquitto.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, "-c", str(config)], stdout=log, stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self.url
            except OSError:
                time.sleep(0.05)  # the broker's own start-up: nothing to wait on but the port
        raise RuntimeError(f"mosquitto did not listen within {timeout}s: {self.log_tail()}")

    def log_tail(self) -> str:
        path = self.dir / "mosquitto.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

"""A server process the tests start on 127.0.0.1 and stop at the end: a free port, a folder of
its own with its log, and a clear error with the log's tail when it does not come up. The
object-store servers (Azurite, moto) and the Cosmos DB-protocol server share it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest

from outbox.testing.servers import free_port, stop_process
from tests.pg import wait_port


def unavailable(why: str) -> NoReturn:
    """A real part the test needs is missing: under ``CI`` that fails the test (CI installs
    every part, so missing means broken), elsewhere it skips, saying how to install it."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


class LocalServer:
    name = "server"
    start_timeout = 60.0  # seconds until its port answers

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"outbox-{self.name}-"))
        self._log = (self.dir / "server.log").open("wb")
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def server_environment(self) -> dict[str, str]:
        return {}

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env={**os.environ, **self.server_environment()},
        )
        try:
            wait_port(self.port, timeout=self.start_timeout)
        except TimeoutError as e:
            output = (self.dir / "server.log").read_bytes()[-2000:]
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {output!r}") from e

    def stop(self) -> None:
        stop_process(self._proc)
        self._proc = None
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

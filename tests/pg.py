"""Start a throwaway PostgreSQL server for the tests (Debian's postgresql package).

``scripts/test.sh`` installs the package when it is missing. Set ``OUTBOX_TEST_PG_URL`` to use a
server you already run instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from outbox.testing.servers import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = _bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")

    @property
    def available(self) -> bool:
        return self.bindir is not None

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as_user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def start(self) -> str:
        assert self.bindir is not None
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "outbox")
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200",
            "-w",
            "start",
        )
        self.url = f"postgresql+psycopg://outbox@127.0.0.1:{self.port}/postgres"
        return self.url

    def stop(self, mode: str = "fast") -> None:
        if self.bindir is None or not self.data.exists():
            return
        subprocess.run(
            [*self._as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def restart(self) -> None:
        self.stop()
        self._run(
            str(self.bindir / "pg_ctl"),  # type: ignore[operator]
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200",
            "-w",
            "start",
        )

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=outbox dbname=postgres", autocommit=True
        ) as c:
            # FILE_COPY (PostgreSQL 15+) copies the template's files instead of logging every
            # page: about half the time per fresh database, and the suite makes hundreds (with
            # fsync=off there is nothing it gives up).
            pg15 = c.info.server_version >= 150000
            strategy = " STRATEGY FILE_COPY" if pg15 else ""
            c.execute(f'CREATE DATABASE "{name}"{strategy}')
        return f"postgresql+psycopg://outbox@127.0.0.1:{self.port}/{name}"

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(port)

"""What every throwaway server of the kit and the tests shares: a free port on 127.0.0.1, and a
stop that waits for the process (SIGTERM, then SIGKILL when it does not go in time)."""

from __future__ import annotations

import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A port nothing listens on now (the server binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(process: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """Stop ``process`` if it still runs: SIGTERM, and SIGKILL after ``timeout`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

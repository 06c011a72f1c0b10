"""Reading a real process's ``--metrics-port``: Prometheus samples and the health answers."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if not k.startswith("otel_"))): (
            s.value
        )
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """``GET path``: (status, the JSON line), a 503 included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(
    process: subprocess.Popen[str], what: str, read: Callable[[], Any], ok: Callable[[Any], bool]
) -> Any:
    """``read()`` until ``ok(result)`` (60 s deadline); a read that cannot connect yet (the
    server not listening) is retried; the process dying fails at once with its stderr."""
    deadline = time.monotonic() + 60
    last: Any = None
    pause = threading.Event()
    while True:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            last = read()
            if ok(last):
                return last
        except OSError:  # not listening yet
            pass
        assert time.monotonic() < deadline, f"{what}: never happened; last read {last}"
        pause.wait(0.05)  # poll again shortly; the deadline bounds the whole wait

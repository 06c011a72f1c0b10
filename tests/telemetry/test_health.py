"""``/healthz`` and ``/readyz`` on the ``--metrics-port`` server.

Liveness: the heartbeat that every ``RunLoop`` iteration gives, and ``Health.alive`` reading it.
Readiness: a real ``outbox run-dispatcher`` whose queue database is PostgreSQL behind a TCP
proxy the test cuts, so the same process goes ready -> not ready (with the reason) -> ready.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from migrations.sql import upgrade
from outbox.app import Outbox
from outbox.core.clock import ManualClock
from outbox.core.health import Health, Heartbeat
from outbox.core.runloop import RunLoop
from tests.telemetry.scrape import free_port, probe, wait_for

OUTBOX = str(Path(sys.executable).with_name("outbox"))


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_alive_while_the_loop_beats_within_its_wait_plus_the_poll_budget() -> None:
    clock = Monotonic()
    heart = Heartbeat(clock)
    health = Health(poll_budget=60, start_grace=120, heartbeat=heart)
    assert health.alive() == (True, "starting")
    clock.now += 121
    assert health.alive() == (False, "no run loop has started in 121s")
    heart.beat(30)  # polled, now waits 30 s
    clock.now += 30 + 60
    assert health.alive() == (True, "ticking")
    clock.now += 1  # the wait and a whole poll budget gone without a beat: stuck in a poll
    assert health.alive() == (False, "the run loop has not ticked for 61s past its wait")
    heart.beat()
    assert health.alive() == (True, "ticking")


def test_every_run_loop_iteration_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Monotonic()
    heart = Heartbeat(clock)
    monkeypatch.setattr("outbox.core.health.HEARTBEAT", heart)
    seen: list[tuple[float | None, float]] = []

    def poll() -> int:
        seen.append((heart.last, heart.due_in))
        clock.now += 1
        return 0

    RunLoop(poll, clock=ManualClock(), idle_wait=5).run(max_iterations=3, handle_signals=False)
    # each poll starts right after a beat that promises nothing (the poll itself is timed)
    assert seen == [(1000.0, 0.0), (1001.0, 0.0), (1002.0, 0.0)]
    heart.beat(5)
    assert heart.silent_for() == -5  # the beat before a wait promises the wait


class Proxy:
    """A TCP proxy to ``target``; ``cut()`` closes the listener and every connection (the
    database host gone: new connections are refused), ``restore()`` listens again."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut: the listener was shut down
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        assert self.listener is not None
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.sockets.clear()


@pytest.mark.postgres
def test_readyz_follows_the_queue_database(pg_url: str, tmp_path: Path) -> None:
    upgrade(pg_url)
    url = make_url(pg_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    ws = tmp_path / "ws"
    Outbox.open(ws, sql_url=proxied).close()  # the table
    port = free_port()
    env = {**os.environ, "OUTBOX_SQL_URL": proxied}
    worker = subprocess.Popen(
        [
            OUTBOX,
            "-w",
            str(ws),
            "run-dispatcher",
            "--poll-interval",
            "100ms",
            "--metrics-port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = (200, {"ready": True, "reason": "store and queue reachable"})
        wait_for(worker, "ready", lambda: probe(port, "/readyz"), lambda r: r == ready)
        assert probe(port, "/healthz") == (200, {"alive": True, "reason": "ticking"})
        proxy.cut()
        status, body = wait_for(
            worker, "not ready", lambda: probe(port, "/readyz"), lambda r: r[0] != 200
        )
        assert status == 503
        assert body["ready"] is False
        reason = body["reason"]
        assert reason.startswith("queue: "), reason
        assert f"port {proxy.port} failed: Connection refused" in reason, reason
        assert "\n" not in reason
        # the worker is retrying the outage, not stuck: alive
        assert probe(port, "/healthz") == (200, {"alive": True, "reason": "ticking"})
        proxy.restore()
        wait_for(worker, "ready again", lambda: probe(port, "/readyz"), lambda r: r == ready)
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err[-3000:]
    assert "Traceback" not in err

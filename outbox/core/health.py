"""Liveness and readiness for the long-running commands, on the ``--metrics-port`` HTTP server.

* ``GET /healthz`` (liveness): 200 while the process's run loops keep ticking. Every
  ``RunLoop`` iteration calls ``beat(wait)`` before its wait, saying when it will be back; the
  process is alive while the last beat's wait plus ``poll_budget`` (the longest a poll may take:
  a batch of commands, a rescue pass, a device's ack) has not run out. A loop stuck in a poll
  (a hung driver call, a deadlock) stops beating and the orchestrator restarts the pod. Error
  backoffs are waits like any other: a loop retrying an outage is alive (readiness says why it is
  not useful).
* ``GET /readyz`` (readiness): 200 when every check passes (the Delta store and the queue are
  reachable), else 503 with one JSON line ``{"ready": false, "reason": "queue: ..."}`` naming the
  first check that failed and its error.
* ``GET /metrics``: the Prometheus text, when metrics are on.

Why one port, not a ``--health-port``: a pod then exposes one port for the scraper and the probes,
and the health answers need no extra option. Why the heartbeat is process-wide: the loops are
built inside the worker, the scheduler and the gateway; a module-level beat reaches them all
without threading an object through each constructor. Every check runs on the request's own
thread (``ThreadingHTTPServer``), so a readiness check stuck on a dead host never blocks
``/healthz`` or ``/metrics``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from outbox.core.errors import ConfigurationError

#: (name, check): the check returns when the part is reachable and raises when it is not.
Check = tuple[str, Callable[[], object]]
#: () -> (body, content type) of the Prometheus text.
MetricsText = Callable[[], tuple[bytes, str]]


class Heartbeat:
    """When the process's run loops were last seen, and how long they said they would wait."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self.last: float | None = None
        self.due_in = 0.0

    def beat(self, due_in: float = 0.0) -> None:
        """A loop is alive and will poll again within ``due_in`` seconds (its wait)."""
        self.last, self.due_in = self.monotonic(), due_in

    def silent_for(self) -> float | None:
        """Seconds past the promised next beat (None: no loop has beaten yet)."""
        if self.last is None:
            return None
        return self.monotonic() - self.last - self.due_in


HEARTBEAT = Heartbeat()


def beat(due_in: float = 0.0) -> None:
    """What ``RunLoop`` calls each iteration (one attribute write: cheap on the hot path)."""
    HEARTBEAT.beat(due_in)


@dataclass
class Health:
    """What ``/healthz`` and ``/readyz`` answer for one command."""

    checks: Sequence[Check] = ()
    #: the longest one poll may take before the process counts as stuck (seconds)
    poll_budget: float = 120.0
    #: before the first beat (start-up: opening the table, connecting), alive for this long
    start_grace: float = 120.0
    heartbeat: Heartbeat = HEARTBEAT

    def __post_init__(self) -> None:
        self._started = self.heartbeat.monotonic()

    def alive(self) -> tuple[bool, str]:
        late = self.heartbeat.silent_for()
        if late is None:
            starting = self.heartbeat.monotonic() - self._started
            if starting > self.start_grace:
                return False, f"no run loop has started in {starting:.0f}s"
            return True, "starting"
        if late > self.poll_budget:
            return False, f"the run loop has not ticked for {late:.0f}s past its wait"
        return True, "ticking"

    def ready(self) -> tuple[bool, str]:
        for name, check in self.checks:
            try:
                check()
            except Exception as e:
                line = " ".join(str(e).split()) or type(e).__name__
                return False, f"{name}: {line}"
        names = [name for name, _ in self.checks]
        if not names:
            return True, "ready"
        return True, " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names) + (
            " reachable"
        )


def serve(port: int, health: Health, metrics: MetricsText | None = None) -> ThreadingHTTPServer:
    """Serve ``/healthz``, ``/readyz`` and (with ``metrics``) ``/metrics`` on 0.0.0.0:``port``
    from a daemon thread; the process's exit ends it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and metrics is not None:
                body, content_type = metrics()
                self._answer(200, body, content_type)
            elif path in ("/healthz", "/readyz"):
                ok, reason = health.alive() if path == "/healthz" else health.ready()
                key = "alive" if path == "/healthz" else "ready"
                line = json.dumps({key: ok, "reason": reason}).encode() + b"\n"
                self._answer(200 if ok else 503, line, "application/json")
            else:
                self._answer(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                # The prober gave up first (its timeout, a load balancer's): nobody is left to
                # answer, and a traceback on stderr would read as the worker's own failure.
                self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            """Probes every few seconds would flood stderr: not logged."""

    try:
        server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    except OSError as e:
        raise ConfigurationError(
            f"--metrics-port {port}: cannot listen ({e.strerror})", hint="choose a free port"
        ) from e
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="outbox-metrics", daemon=True).start()
    return server

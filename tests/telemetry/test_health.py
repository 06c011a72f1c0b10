"""``/healthz`` and ``/readyz`` on the ``--metrics-port`` server.

Liveness: the heartbeat that every ``RunLoop`` iteration gives, and ``Health.alive`` reading it.
Readiness from a real process: ``test_prometheus.py`` (its ``run-dispatcher`` has its PostgreSQL
queue behind a proxy the test cuts) and ``tests/mqtt/test_gateway_metrics.py``.
"""

from __future__ import annotations

import pytest

from outbox.core.clock import ManualClock
from outbox.core.health import Health, Heartbeat
from outbox.core.runloop import RunLoop


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


def test_ready_names_the_first_failing_check_in_one_line() -> None:
    def down() -> None:
        raise ConnectionError("connection refused\n  (the host is gone)")

    checks = [("store", lambda: 7), ("queue", down), ("broker", down)]
    assert Health(checks).ready() == (False, "queue: connection refused (the host is gone)")
    assert Health(checks[:1]).ready() == (True, "store reachable")


def test_a_prober_that_hangs_up_before_the_answer_leaves_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """CI saw ``BrokenPipeError`` tracebacks on a worker's stderr when a probe's client timed out
    before a slow readiness check answered (issue 42's run). The client here resets the
    connection while the check is held, so the answer's write always meets a closed peer."""
    import socket
    import struct
    import threading

    from outbox.core.health import serve

    entered, release = threading.Event(), threading.Event()

    def slow_check() -> None:
        entered.set()
        assert release.wait(30)

    server = serve(0, Health(checks=[("store", slow_check)]))
    try:
        port = server.server_address[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.wait(30)
        # linger 0: close sends a reset, so the server's first write fails
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        handlers = [t for t in threading.enumerate() if "process_request" in t.name]
        release.set()
        for t in handlers:
            t.join(30)
            assert not t.is_alive()
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err

"""Real processes against one queue: competing receivers, a SIGKILLed lock holder, SIGTERM."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import QueueMessage, SqlQueue
from outbox.core.clock import ManualClock
from tests import children
from tests.queue import workers

pytestmark = pytest.mark.slow
ctx = children.ctx


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _run(procs: list[Any], timeout: float = 120) -> None:
    """Start, join and check the exit of every process; kill what is left if one fails."""
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
            assert p.exitcode == 0, f"{p.name} exited {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def test_competing_receivers(migrated_url: str, tmp_path: Path) -> None:
    """Three receiving processes drain one queue (sessions, loose messages, abandons): no message
    or session is ever held by two at once, every message is completed exactly once, each
    session in order.

    That every receiver takes part is made so, not hoped for: each holds its first batch until
    all three hold one (a barrier), so at that moment the three hold locks together (on a loaded
    machine one receiver could otherwise drain all 80 before the others start). Those three
    batches must be disjoint, in messages and in sessions; a queue that handed one message or
    session to two receivers fails there, on the O_EXCL markers and on the exactly-once count."""
    sessions, per_session, loose, receivers = 6, 10, 20, 3
    queue = SqlQueue(migrated_url)
    batch = [
        QueueMessage(b"x", message_id=f"s{s}-{i}", session_id=f"S{s}")
        for i in range(per_session)
        for s in range(sessions)
    ] + [QueueMessage(b"x", message_id=f"n-{i}") for i in range(loose)]
    queue.send("work", batch)
    (tmp_path / "markers").mkdir()
    start, holding = ctx.Barrier(receivers), ctx.Barrier(receivers)
    _run(
        [
            children.process(workers.compete, migrated_url, str(tmp_path), w, start, holding)
            for w in range(receivers)
        ]
    )
    violations = tmp_path / "violations.txt"
    assert not violations.exists(), violations.read_text()
    firsts = [
        [line.split() for line in (tmp_path / f"first-{w}.log").read_text().splitlines()]
        for w in range(receivers)
    ]
    assert all(firsts), firsts  # every receiver held some of the work at the same moment
    held_ids = [m for first in firsts for m, _ in first]
    assert len(held_ids) == len(set(held_ids)), firsts  # no message locked by two at once
    held_sessions = [s for first in firsts for s in {s for _, s in first} - {"-"}]
    assert len(held_sessions) == len(set(held_sessions)), firsts  # nor a session
    done = [
        line
        for w in range(receivers)
        if (tmp_path / f"done-{w}.log").exists()
        for line in (tmp_path / f"done-{w}.log").read_text().split()
    ]
    assert sorted(done) == sorted(m.message_id for m in batch)  # each completed exactly once
    for s in range(sessions):
        handled = (tmp_path / f"session-S{s}.log").read_text().split()
        assert handled == [f"s{s}-{i}" for i in range(per_session)]  # FIFO, no repeats
    assert queue.stats() == {}
    queue.close()


def test_sigkilled_holder_loses_its_locks_after_expiry(migrated_url: str, tmp_path: Path) -> None:
    queue = SqlQueue(migrated_url)
    queue.send("work", [QueueMessage(b"x", message_id=f"k{i}") for i in range(5)])
    ready = tmp_path / "ready"
    p = children.process(workers.hold_and_hang, migrated_url, str(ready), 3)
    p.start()
    _wait_for(ready)
    held = ready.read_text().split()
    os.kill(p.pid or 0, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    # The child locked with the wall clock; continue from there with a clock we control.
    clock = ManualClock(datetime.now(UTC))
    after = SqlQueue(migrated_url, clock=clock, lock_duration=30)
    rest = after.receive("work", 10)
    assert sorted(m.message_id for m in rest) == ["k3", "k4"]
    for m in rest:
        after.complete(m)
    clock.advance(31)
    back = after.receive("work", 10)
    assert sorted(m.message_id for m in back) == sorted(held)
    assert {m.delivery_count for m in back} == {2}
    after.close()
    queue.close()


def test_sigterm_finishes_in_flight_message(migrated_url: str, tmp_path: Path) -> None:
    queue = SqlQueue(migrated_url)
    queue.send("work", [QueueMessage(b"x", message_id=f"t{i}") for i in range(3)])
    started = tmp_path / "started"
    p = children.process(workers.consume_until_sigterm, migrated_url, str(started))
    p.start()
    _wait_for(started)
    os.kill(p.pid or 0, signal.SIGTERM)
    p.join(30)
    assert p.exitcode == 0
    left = queue.peek("work", 10)
    assert started.read_text() not in {m.message_id for m in left}  # finished and completed
    assert len(left) == 2
    assert all(m.state == "active" for m in left)  # no locks left behind
    queue.close()

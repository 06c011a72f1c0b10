"""Consistent redelivery, one holder per session, and a dead letter mid-session, with real
processes on SQLite and PostgreSQL (issue 16).

Five sessions are sent interleaved in one batch. A process takes three sessions' heads with a 1 s
lock and is SIGKILLed; two competing processes then handle everything (each holds its first
batch until both hold one, so both take part however the machine schedules them): some messages
are abandoned with a backoff on their first delivery, and one message (``P-2``) fails every time
until ``max_delivery_count`` (3) dead-letters it mid-session. From the shared handling log:

* per session, the handled index never goes down: a redelivered message n is handled again before
  any later message, never after one (consistent redelivery);
* the first handling order per session equals the send order;
* never two holders of one session at once (O_EXCL markers);
* the dead-lettered message's session goes on: its later messages are handled in order after it,
  and only it is in dead letters.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from dispatcher.queue import QueueMessage, SqlQueue
from tests import children
from tests.queue import order_workers

pytestmark = pytest.mark.slow
# The processes come from the tests' fork server (``tests.children``), which imported the workers
# (and SQLAlchemy, the drivers) once: each starts in milliseconds instead of re-importing
# everything, and the server is single-threaded, so forking it is safe where forking pytest
# would not be.
ctx = children.ctx
SESSIONS = {"A": 10, "B": 10, "C": 10, "D": 10, "P": 6}
POISON = "P-2"
WORKERS = 2


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_first_handling_follows_send_order_through_every_redelivery(
    migrated_url: str, tmp_path: Path
) -> None:
    queue = SqlQueue(migrated_url, max_delivery_count=3)
    longest = max(SESSIONS.values())
    queue.send(
        order_workers.QUEUE,
        [
            QueueMessage(
                b"poison" if f"{s}-{i}" == POISON else b"ok", message_id=f"{s}-{i}", session_id=s
            )
            for i in range(longest)
            for s, n in SESSIONS.items()
            if i < n
        ],
    )
    (tmp_path / "markers").mkdir()
    ready = tmp_path / "ready"
    # every process starts at once (starting is most of the time); the workers wait at the
    # barrier until the holder is dead, and each then holds its first batch until all hold one
    # (so several handle messages by construction, not by the scheduler's grace)
    start, holding = ctx.Barrier(WORKERS + 1), ctx.Barrier(WORKERS)
    procs = [
        children.process(order_workers.work, migrated_url, str(tmp_path), w, start, holding)
        for w in range(WORKERS)
    ]
    holder = children.process(order_workers.take_and_hang, migrated_url, str(tmp_path), str(ready))
    holder.start()
    for p in procs:
        p.start()
    _wait_for(ready)
    killed = ready.read_text().split()
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join(10)
    assert holder.exitcode == -signal.SIGKILL
    start.wait(60)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    violations = tmp_path / "violations.txt"
    assert not violations.exists(), violations.read_text()
    handled: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for line in (tmp_path / "handled.log").read_text().splitlines():
        session, mid, count, who = line.split()
        handled[session].append((int(mid.split("-")[1]), int(count), who))
    for session, n in SESSIONS.items():
        indices = [i for i, _, _ in handled[session]]
        assert indices == sorted(indices), f"{session}: redelivery out of order: {indices}"
        first = list(dict.fromkeys(indices))
        assert first == list(range(n)), f"{session}: first handlings {first}"
    # every scenario happened: the SIGKILLed holder's messages came back with a second delivery,
    # abandons with backoff redelivered, the poison went three times, every worker handled some
    redelivered = {f"{s}-{i}" for s, hs in handled.items() for i, count, _ in hs if count == 2}
    assert set(killed) <= redelivered
    assert len(killed) == 3
    assert {f"{s}-1" for s in SESSIONS} <= redelivered
    assert [c for i, c, _ in handled["P"] if i == 2] == [1, 2, 3]
    workers = {f"w{w}" for w in range(WORKERS)}
    assert {who for hs in handled.values() for _, _, who in hs} == {"killed", *workers}
    # the dead letter mid-session: only it, and the session's later messages were all handled
    [dead] = queue.list_dead_letters(order_workers.QUEUE)
    assert (dead.message_id, dead.reason, dead.delivery_count) == (
        POISON,
        "MaxDeliveryCountExceeded",
        3,
    )
    p_indices = [i for i, _, _ in handled["P"]]
    last_poison = max(k for k, i in enumerate(p_indices) if i == 2)
    assert list(dict.fromkeys(p_indices[last_poison + 1 :])) == [3, 4, 5]
    assert queue.stats(order_workers.QUEUE)[order_workers.QUEUE].total == 0
    queue.close()

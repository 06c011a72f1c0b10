"""Receivers racing on one PostgreSQL queue never lock one message twice and lose none.

Six threads, each with its own queue object (its own connections), start together and drain 240
messages three at a time; each holds its first batch until all six hold one, so all six hold
locks at the same moment however the machine schedules them. Locks last 300 s, so no lock
expires during the test and any message received twice was locked by two receivers at once (what
``FOR UPDATE SKIP LOCKED`` prevents: without it, two receivers select the same head rows and both
lock them).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from dispatcher.queue import QueueMessage, SqlQueue
from migrations.sql import upgrade
from outbox.core.errors import LockLostError

pytestmark = pytest.mark.postgres
RECEIVERS, MESSAGES = 6, 240


def test_receivers_never_share_a_lock_nor_lose_a_message(pg_url: str) -> None:
    upgrade(pg_url)
    sender = SqlQueue(pg_url)
    sender.send("work", [QueueMessage(b"x", message_id=f"m{i}") for i in range(MESSAGES)])
    queues = [SqlQueue(pg_url, lock_duration=300) for _ in range(RECEIVERS)]
    start = threading.Barrier(RECEIVERS)
    # Each receiver holds its first batch until all hold one: then all six hold locks at once,
    # whatever the scheduler does (on a loaded machine one thread could drain all 240 first).
    holding = threading.Barrier(RECEIVERS)
    received: list[list[str]] = [[] for _ in range(RECEIVERS)]
    errors: list[BaseException] = []
    stolen: list[str] = []

    def drain(w: int) -> None:
        try:
            start.wait()
            while batch := queues[w].receive("work", 3):
                if not received[w]:
                    holding.wait()  # 6 x 3 held of 240: every first receive finds messages
                received[w] += [m.message_id for m in batch]
                for m in batch:
                    try:
                        queues[w].complete(m)
                    except LockLostError:  # another receiver re-locked it: counted below
                        stolen.append(m.message_id)
        except BaseException as e:
            errors.append(e)
            holding.abort()  # the others fail at the barrier instead of waiting for this one

    threads = [threading.Thread(target=drain, args=(w,)) for w in range(RECEIVERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counts = Counter(mid for got in received for mid in got)
    twice = sorted(mid for mid, n in counts.items() if n > 1)
    assert not twice, f"locked by two receivers at once: {twice[:10]}"
    assert not stolen, f"completions that found their lock taken: {stolen[:10]}"
    assert not errors, errors
    assert set(counts) == {f"m{i}" for i in range(MESSAGES)}  # none lost
    assert all(received), [len(got) for got in received]  # all held locks at once
    assert sender.stats() == {}
    for q in [sender, *queues]:
        q.close()

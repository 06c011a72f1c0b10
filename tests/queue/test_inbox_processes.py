"""Two processes, one delivery each of one message id, released together: the handler runs in
one process only (SQL inbox here on SQLite and PostgreSQL; the Cosmos inbox in
tests/cosmos/test_inbox_processes.py, with the same worker).

Each process receives its delivery, waits at a barrier until the other has its own, then runs a
``Consumer`` over the shared inbox. A handler writes one line to a shared log, then waits until
the other delivery has decided (run its handler too, or been settled), so without a claim both
handlers would run. The waiting delivery is completed later, without running the handler.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.queue import Consumer, QueueMessage, SqlQueue
from dispatcher.queue.inbox import Inbox, SqlInbox
from outbox.core.clock import ManualClock
from tests import children

pytestmark = pytest.mark.slow
ctx = children.ctx  # forked from a fork server: nothing of pytest's threads
T0 = datetime(2026, 12, 1, tzinfo=UTC)
QUEUE = "q"
WAIT = 60.0


def _inbox(spec: tuple[str, ...], queue: SqlQueue) -> Inbox:
    if spec[0] == "sql":
        return SqlInbox(queue.database, "billing")
    from dispatcher.queue.inbox_cosmos import CosmosInbox
    from outbox.core.cosmos import make_client
    from outbox.core.errors import QueueError, QueueUnavailableError

    _, endpoint, key, database, container = spec
    client = make_client(endpoint, key, unavailable=QueueUnavailableError, failed=QueueError)
    proxy = client.get_database_client(database).get_container_client(container)
    return CosmosInbox(proxy, "billing", client=client)


def deliver_once(
    url: str, spec: tuple[str, ...], workdir: str, name: str, *, received: Any, decided: Any
) -> None:
    """One process: receive one delivery, meet the other at ``received``, handle it."""
    clock = ManualClock(T0 + timedelta(seconds=602))
    queue = SqlQueue(url, clock=clock, lock_duration=30, max_delivery_count=5)
    log = Path(workdir) / "handled.log"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def handler(m: Any) -> None:
        os.write(fd, f"{name} {m.message_id} {m.body.decode()}\n".encode())
        if len(log.read_text().splitlines()) >= 2:
            decided.set()  # the second handler: both ran
        if not decided.wait(WAIT):
            raise AssertionError("the other delivery never decided")

    real_receive = queue.receive

    def receive(*a: Any, **kw: Any) -> Any:
        got = real_receive(*a, **kw)
        received.wait(WAIT)
        return got

    queue.receive = receive  # type: ignore[method-assign]
    inbox = _inbox(spec, queue)
    try:
        Consumer(queue, QUEUE, handler, inbox=inbox, claim_owner=name).run_once(max_messages=1)
    finally:
        decided.set()
        os.close(fd)
        queue.close()


def run_two_processes(url: str, spec: tuple[str, ...], workdir: Path) -> list[str]:
    """Send "x" twice (past duplicate detection), run both processes, return the log lines."""
    clock = ManualClock(T0)
    queue = SqlQueue(url, clock=clock, duplicate_detection_window=600)
    try:
        queue.send(QUEUE, QueueMessage(b"1", message_id="x"))
        clock.advance(601)
        queue.send(QUEUE, QueueMessage(b"2", message_id="x"))
    finally:
        queue.close()
    received, decided = ctx.Barrier(2), ctx.Event()
    procs = [
        children.process(
            deliver_once, url, spec, str(workdir), f"p{i}", received=received, decided=decided
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WAIT * 2)
        assert p.exitcode == 0
    return (workdir / "handled.log").read_text().splitlines()


def finish(url: str, spec: tuple[str, ...]) -> list[str]:
    """One lease later: the waiting delivery is completed without running the handler."""
    queue = SqlQueue(url, clock=ManualClock(T0 + timedelta(seconds=602 + 30)))
    calls: list[str] = []
    try:
        consumer = Consumer(
            queue, QUEUE, lambda m: calls.append(m.message_id), inbox=_inbox(spec, queue)
        )
        assert consumer.run_once() == 1
        assert queue.stats() == {}
    finally:
        queue.close()
    return calls


def test_two_processes_one_handler(migrated_url: str, tmp_path: Path) -> None:
    spec = ("sql",)
    lines = run_two_processes(migrated_url, spec, tmp_path)
    assert len(lines) == 1, f"the handler ran in both processes: {lines}"
    assert finish(migrated_url, spec) == []

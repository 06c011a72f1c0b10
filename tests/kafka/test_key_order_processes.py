"""Per-key order across documents and processes, against a real Kafka broker killed under load
(issue 42, item 5).

Three writer processes commit documents on keys of their own (three each), with immediate
dispatch; a command worker (``run-dispatcher``'s loop, one command per batch) runs beside them.
The broker is killed after the first phase, the second phase is committed while it is down (every
send fails: keys pause, documents are held), and the third right after it is back (new documents
meet keys still paused). Read from the topic as a consumer reads it, every key's messages are
first delivered in the order their writer committed them, and all of them arrive.

With the paused keys kept in each process's memory (the mutation, as before the lines moved to
the queue's database), the held documents go out in the order their retry commands come back,
and the same check fails.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.kafka.mapping import record_of
from outbox.app.facade import Outbox
from testkit.kafka import KafkaBroker, read_records
from tests.kafka import key_order_procs as procs

pytestmark = pytest.mark.slow
ctx = multiprocessing.get_context("spawn")
#: Three writers of four units of work a phase (four writers of six before issue 43's suite
#: time): every kind of unit (a new document, a later message of a document held two
#: commits back) meets a paused key in phases 2 and 3, and two writers send the shared key's later
#: messages the mutation lets overtake writer 0's.
WRITERS, PER_PHASE = 3, 4
DEADLINE = 300.0
#: Each key's messages (their bodies), in the order they were first delivered.
Delivered = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def own_broker() -> Iterator[KafkaBroker]:
    """A broker of this module's own: its tests kill and restart it (the shared one serves
    others). One for both tests, not one each: a start costs 10-30 s on a loaded machine."""
    from tests.local_server import unavailable

    b = KafkaBroker()
    if not b.available:
        unavailable("the Kafka broker's JARs or Java are missing; run scripts/fetch-kafka.sh")
    b.start()
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture
def broker(own_broker: KafkaBroker) -> KafkaBroker:
    """The module's broker, running (a test that failed while it was down left it killed)."""
    if own_broker.process is None:
        own_broker.start()
    return own_broker


def _wait(condition: Any, what: str, children: list[Any], timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not condition():
        dead = [p.name for p in children if p.exitcode not in (None, 0)]
        assert not dead, f"{dead} died while waiting for {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def run_scenario(tmp_path: Path, broker: KafkaBroker, *, local_lines: bool) -> Delivered:
    """The scenario; returns each key's messages in the order they were first delivered."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    ws = tmp_path / "ws"
    with Outbox.open(
        ws,
        transport="kafka",
        kafka_bootstrap_servers=broker.bootstrap,
        destinations=[topic],
        default_destination=topic,
    ) as ob:
        ob.backends.migrate()  # the topic and its dead-letter topic
    phases = tmp_path / "phases"
    phases.mkdir()
    where = (str(ws), broker.bootstrap, topic)
    workers = [
        ctx.Process(target=procs.worker, args=(where, str(tmp_path / f"stop-{i}"), local_lines))
        for i in (1, 2)
    ]
    writers = [
        ctx.Process(target=procs.writer, args=(where, w, str(phases), PER_PHASE, local_lines))
        for w in range(WRITERS)
    ]
    for p in [workers[0], *writers]:
        p.start()
    try:
        for phase in (1, 2, 3):
            if phase == 2:
                broker.kill()  # every send of this phase fails: keys pause, documents wait
            if phase == 3:
                # The worker tries the oldest commands three times while the broker is down,
                # then dies (SIGKILL): the keys its writers paused are still paused, the
                # documents held, when the next commits come.
                _wait(lambda: _most_tries(ws) >= 3, "three tries of a command", workers[:1])
                workers[0].kill()
                workers[0].join()
                broker.start()
            (phases / f"go-{phase}").touch()
            _wait(
                lambda ph=phase: all((phases / f"w{w}-{ph}").exists() for w in range(WRITERS)),
                f"the writers' phase {phase}",
                [*workers[:1], *writers] if phase < 3 else writers,
            )
        for p in writers:
            p.join(60)
            assert p.exitcode == 0
        # A new worker (run-dispatcher restarted) drains what the writers held, in line order.
        workers[1].start()
        with Outbox.open(ws, create=False) as ob:
            _wait(lambda: ob.store.scan_pending().num_rows == 0, "every message sent", workers[1:])
    finally:
        (tmp_path / "stop-2").touch()
        workers[1].join(60)
        for p in [*workers, *writers]:
            if p.is_alive():
                p.kill()
                p.join()
    delivered: Delivered = {}
    seen: set[str] = set()
    for r in (record_of(x) for x in read_records(broker.bootstrap, topic)):
        if r.message_id in seen:  # a re-send (same id): the consumer's inbox drops it
            continue
        seen.add(r.message_id)
        body = json.loads(r.body)
        delivered.setdefault(body["key"], []).append(body)
    assert len(seen) == WRITERS * (3 * PER_PHASE + 1), "every message arrived"
    return delivered


def _most_tries(ws: Path) -> int:
    from dispatcher.queue.sql_queue import SqlQueue

    queue = SqlQueue(f"sqlite:///{ws / 'outbox.db'}")
    try:
        return max((m.delivery_count for m in queue.peek("outbox-commands", 1000)), default=0)
    finally:
        queue.close()


def out_of_order(delivered: Delivered) -> int:
    """Per-writer keys: messages first delivered after a message committed later. The shared key:
    phase-3 messages (committed after writer 0's phase-2 one) delivered before it."""
    late = 0
    for key, bodies in delivered.items():
        if key == procs.SHARED:
            phases = [b["phase"] for b in bodies]
            late += phases.index(2)  # every phase-3 message that went ahead of it
        else:
            ns = [b["n"] for b in bodies]
            late += sum(1 for a, b in itertools.pairwise(ns) if b < a)
    return late


def test_held_documents_leave_in_commit_order_whoever_sends_them(
    tmp_path: Path, broker: KafkaBroker
) -> None:
    delivered = run_scenario(tmp_path, broker, local_lines=False)
    assert out_of_order(delivered) == 0, delivered


def test_with_paused_keys_in_each_process_alone_the_order_breaks(
    tmp_path: Path, broker: KafkaBroker
) -> None:
    """The mutation: with the lines in each process's memory, the other writers never learn that
    writer 0 paused the shared key, and send their later messages of it ahead of its gate."""
    delivered = run_scenario(tmp_path, broker, local_lines=True)
    assert out_of_order(delivered) > 0, delivered

"""Children of the per-session order proof through the whole outbox (``test_geo_order``): a
writer with immediate dispatch through the geo transport, a command worker beside it, a consumer
per region recording when each handler begins and ends, and a process that holds the claim log
locked. Spawned, not forked (deltalake hangs in forked children).

``mutation`` breaks the writer and the worker: ``local-lines`` keeps their paused keys in their
own memory (as before the lines moved to the queue's database); any other name is a source
mutation of ``tests.mutate`` applied in the child.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Engine, Float, Integer, MetaData, String, Table, event, insert

from outbox.core.sql import make_engine

QUEUE = "shipments"
SESSIONS = ("s0", "s1", "s2", "s3")
#: The secondary copy's delay and the claim lease of the proof.
DELAY, LEASE = 1.0, 2.0
#: How long a send waits on the claim log, and how long a claim-log statement waits for SQLite's
#: lock, before giving up: a locked claim log is "unavailable" quickly.
CLAIM_LOG_TIMEOUT, CLAIMS_BUSY = 0.5, 0.2

meta = MetaData()
runs = Table(
    "runs",
    meta,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("i", Integer, nullable=False),  # the message's place in its session, by commit
    Column("region", String(16), nullable=False),
    Column("began", Float, nullable=False),
    Column("ended", Float, nullable=True),
)


def runs_engine(path: str) -> Engine:
    engine = make_engine(f"sqlite:///{path}")
    meta.create_all(engine)
    return engine


def _busy(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.execute(f"PRAGMA busy_timeout={int(CLAIMS_BUSY * 1000)}")


def claim_log(url: str) -> Any:
    from dispatcher.claims.sql import SqlClaimLog

    engine = make_engine(url)
    event.listen(engine, "connect", _busy)  # after the framework's pragmas
    return SqlClaimLog(engine=engine)


def _outbox(ws: str, urls: dict[str, str], mutation: str) -> Any:
    from dispatcher.queue import SqlQueue
    from dispatcher.queue.key_lines import MemoryKeyLines
    from dispatcher.transports.geo import GeoReplicatedTransport
    from dispatcher.transports.sql import SqlQueueTransport
    from outbox.app.facade import Outbox

    geo = GeoReplicatedTransport(
        SqlQueueTransport(SqlQueue(urls["east"])),
        SqlQueueTransport(SqlQueue(urls["west"])),
        DELAY,
        claims=claim_log(urls["claims"]),
        claim_log_timeout=CLAIM_LOG_TIMEOUT,
    )
    ob = Outbox.open(ws, create=False, transport=geo, default_destination=QUEUE)
    if mutation == "local-lines":
        ob.runtime.dispatcher.keys.lines = MemoryKeyLines()
    elif mutation:
        from tests.mutate import apply

        apply(mutation)
    return ob


def wait_file(path: Path, deadline: float = 300.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def writer(
    ws: str, urls: dict[str, str], phases: str, shape: tuple[int, int], mutation: str
) -> None:
    """``shape``: ``(batches, per_batch)``, batches of ``per_batch`` documents, each opened by
    ``go-<b>``. Each document gets two messages on its session, in two units of work: the first
    when it is created, the second right after the next document of that session is created (so
    a session's line reads A-1, B-1, A-2: the gate's own later message must wait behind B).
    Messages are numbered per session in commit order."""
    logging.basicConfig(level=logging.WARNING)
    folder = Path(phases)
    counters = dict.fromkeys(SESSIONS, 0)

    def send(doc: Any, s: str) -> None:
        counters[s] += 1
        doc.send("Moved", json.dumps({"s": s, "i": counters[s]}), ordering_key=s)

    batches, per_batch = shape
    with _outbox(ws, urls, mutation) as ob:
        total = per_batch * batches
        for d in range(total):
            if d % per_batch == 0:
                wait_file(folder / f"go-{d // per_batch + 1}")
            with ob.unit_of_work() as uow:
                send(uow.create(f"d{d}", type="Shipment"), SESSIONS[d % 4])
            second = [d - 4] if d >= 4 else []
            if d == total - 1:  # the last documents of each session get theirs at the end
                second += list(range(max(0, total - 4), total))
            for a in second:
                with ob.unit_of_work() as uow:
                    doc = uow.get(f"d{a}")
                    assert doc is not None
                    send(doc, SESSIONS[a % 4])
            if d % per_batch == per_batch - 1:
                (folder / f"wrote-{d // per_batch + 1}").touch()


def worker(ws: str, urls: dict[str, str], stop: str, mutation: str) -> None:
    from dispatcher.worker import DispatcherWorker

    logging.basicConfig(level=logging.WARNING)
    with _outbox(ws, urls, mutation) as ob:
        w = DispatcherWorker(ob.runtime, batch_size=4, poll_interval=0.05)
        threading.Thread(
            target=lambda: (wait_file(Path(stop), 3600), w.stop()), daemon=True
        ).start()
        w.run()


def locker(claims_path: str, locked: str, release: str) -> None:
    """Hold the claim log's SQLite file with ``BEGIN EXCLUSIVE`` from ``locked`` to ``release``:
    no claim can be read or written meanwhile."""
    c = sqlite3.connect(claims_path, isolation_level=None)
    c.execute("BEGIN EXCLUSIVE")
    Path(locked).touch()
    wait_file(Path(release), 3600)
    c.execute("ROLLBACK")
    c.close()


def region(name: str, urls: dict[str, str], runs_path: str, ready: str) -> None:
    """A region's consumer with the claim log, recording each handler's begin and end."""
    from dispatcher.queue import Consumer, SqlQueue

    logging.basicConfig(level=logging.WARNING)
    queue = SqlQueue(urls[name], lock_duration=5, max_delivery_count=10_000)
    engine = runs_engine(runs_path)

    def handler(m: Any) -> None:
        body = json.loads(m.body)
        with engine.begin() as c:
            n = c.execute(
                insert(runs).values(
                    message_id=m.message_id,
                    session_id=body["s"],
                    i=body["i"],
                    region=name,
                    began=time.time(),
                )
            ).inserted_primary_key[0]
        time.sleep(0.02)  # the handler's work: long enough for an overlap to show
        with engine.begin() as c:
            c.execute(runs.update().where(runs.c.n == n).values(ended=time.time()))

    consumer = Consumer(
        queue,
        QUEUE,
        handler,
        claims=claim_log(urls["claims"]),
        claim_owner=name,
        claim_lease=LEASE,
        look_again=0.2,
        poll_interval=0.05,
        renew_check_interval=0.1,
        backoff=lambda _n: 0.2,
    )
    Path(ready).touch()
    consumer.run_forever()

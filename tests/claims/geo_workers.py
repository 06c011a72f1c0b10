"""Process entry points for the two-region proof (importable under ``spawn``): one consumer per
region over its own SQLite queue, one shared claim log, handler effects in a shared table."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    event,
    func,
    insert,
    select,
)

from dispatcher.claims.sql import SqlClaimLog
from dispatcher.queue import Consumer, SqlQueue
from dispatcher.queue.messages import ReceivedMessage
from outbox.core.sql import make_engine

QUEUE = "shipments"
#: Claim lease of the proof's consumers: the window in which a stuck handler holds its message.
LEASE = 2.0
#: A short busy timeout on the claim log, so a locked claim database is "unavailable" quickly.
CLAIMS_BUSY_TIMEOUT = 0.2

meta = MetaData()
effects = Table(
    "effects",
    meta,
    Column("message_id", String(128), primary_key=True),  # the unique key of the effect
    Column("session_id", String(128), nullable=False),
    Column("i", Integer, nullable=False),
    Column("region", String(16), nullable=False),
    Column("at", Float, nullable=False),
)
duplicates = Table(
    "duplicates",
    meta,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(128), nullable=False),
    Column("region", String(16), nullable=False),
)
violations = Table(
    "violations",
    meta,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("what", String(256), nullable=False),
)
calls = Table(
    "calls",
    meta,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(128), nullable=False),
    Column("region", String(16), nullable=False),
)


def effects_engine(path: str) -> Engine:
    engine = make_engine(f"sqlite:///{path}")
    meta.create_all(engine)
    return engine


def record_effect(engine: Engine, m: ReceivedMessage, region: str) -> None:
    """The handler's effect, keyed by message id; a repeat or an out-of-order one is recorded
    (one BEGIN IMMEDIATE transaction: the two processes' effects are serialized)."""
    i = int(json.loads(m.body)["i"])
    session = m.session_id or ""
    with engine.begin() as c:
        c.execute(insert(calls).values(message_id=m.message_id, region=region))
        if c.execute(select(effects.c.i).where(effects.c.message_id == m.message_id)).first():
            c.execute(insert(duplicates).values(message_id=m.message_id, region=region))
            return
        last = c.execute(
            select(func.max(effects.c.i)).where(effects.c.session_id == session)
        ).scalar()
        if (last or 0) != i - 1:
            c.execute(insert(violations).values(what=f"{m.message_id} after {session}#{last}"))
        c.execute(
            insert(effects).values(
                message_id=m.message_id, session_id=session, i=i, region=region, at=time.time()
            )
        )


def _short_busy_timeout(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.execute(f"PRAGMA busy_timeout={int(CLAIMS_BUSY_TIMEOUT * 1000)}")


def run_region(
    region: str, queue_url: str, claims_url: str, effects_path: str, workdir: str, *, hang_on: str
) -> None:
    """A region's consumer until SIGTERM. ``hang_on``: a message id whose handler hangs forever
    after writing ``<workdir>/hung`` (the test SIGKILLs the process there)."""
    logging.basicConfig(level=logging.WARNING)
    queue = SqlQueue(queue_url, lock_duration=5, max_delivery_count=10_000)
    claims_engine = make_engine(claims_url)
    if claims_url.startswith("sqlite"):
        # after the framework's pragmas (busy_timeout 30 s): a locked claim log fails fast
        event.listen(claims_engine, "connect", _short_busy_timeout)
    claims = SqlClaimLog(engine=claims_engine)
    engine = effects_engine(effects_path)

    def handler(m: ReceivedMessage) -> None:
        if m.message_id == hang_on:
            with engine.begin() as c:
                c.execute(insert(calls).values(message_id=m.message_id, region=region))
            Path(workdir, "hung").write_text(m.message_id)
            time.sleep(600)  # SIGKILLed here
        record_effect(engine, m, region)

    consumer = Consumer(
        queue,
        QUEUE,
        handler,
        claims=claims,
        claim_owner=region,
        claim_lease=LEASE,
        look_again=0.2,
        poll_interval=0.05,
        renew_check_interval=0.1,
        backoff=lambda _n: 0.2,
    )
    Path(workdir, f"ready-{region}").write_text("")
    consumer.run_forever()
    claims.close()
    queue.close()

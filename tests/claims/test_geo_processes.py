"""The two-region proof with real processes: two regions as two SQLite queue files, one consumer
process per region, one claim log (a third SQLite file), the handler's effects in a table keyed
by message id. Per scenario: every message handled, none twice, none out of its session's order.

Scenarios: normal (the primary handles everything, the secondary only completes its copies); the
primary region's queue unavailable for sends (the secondary handles everything after
``secondary_delay``); the primary consumer SIGKILLed inside a handler (the secondary takes over
once the claim's lease ends); the claim log unavailable for a while (nothing handled meanwhile,
nothing lost)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dispatcher.claims.sql import SqlClaimLog
from dispatcher.queue import SqlQueue
from dispatcher.transports.base import Transport, TransportMessage
from dispatcher.transports.geo import GeoReplicatedTransport
from dispatcher.transports.sql import SqlQueueTransport
from migrations.sql import upgrade
from outbox.testing.faulty import FaultyTransport
from tests.claims import geo_workers as w

pytestmark = pytest.mark.slow
#: The consumers fork from one server that imported the worker module (and SQLAlchemy) once. The
#: server is shared by the whole test session: the preload is set when starting a child (it only
#: counts before the server starts, and a child imports whatever the preload lacks itself).
ctx = multiprocessing.get_context("forkserver")
PRELOAD = ["tests.claims.geo_workers"]

SESSIONS, PER_SESSION = 3, 4
TOTAL = SESSIONS * PER_SESSION
DELAY = 1.0  # secondary_delay of the proof
#: The normal scenario's delay: long enough that the primary handles everything first even on a
#: loaded machine (the assertion is that the secondary never calls its handler).
NORMAL_DELAY = 2.5
DEADLINE = 30.0


@dataclass
class Report:
    scenario: str
    messages: int
    handler_calls: dict[str, int]
    duplicates: int
    order_violations: int
    lost: int
    failover_latency: float | None = None

    def line(self) -> str:
        return (
            f"{self.scenario}: messages {self.messages}, handler calls {self.handler_calls}, "
            f"duplicates {self.duplicates}, order violations {self.order_violations}, "
            f"lost {self.lost}, failover latency "
            + ("-" if self.failover_latency is None else f"{self.failover_latency:.2f}s")
        )


class Regions:
    def __init__(self, root: Path, urls: dict[str, str]) -> None:
        self.root = root
        self.urls = urls
        self.effects_path = str(root / "effects.db")
        self.effects = w.effects_engine(self.effects_path)
        self.queues = {r: SqlQueue(self.urls[r]) for r in ("east", "west")}
        self.claims = SqlClaimLog(self.urls["claims"])
        self.procs: dict[str, Any] = {}
        self.transports: list[GeoReplicatedTransport] = []  # closed with the regions

    def geo(self, primary_down: bool = False, delay: float = DELAY) -> GeoReplicatedTransport:
        east: Transport = SqlQueueTransport(self.queues["east"])
        if primary_down:
            faulty = FaultyTransport(east)
            faulty.outage()
            east = faulty
        geo = GeoReplicatedTransport(
            east, SqlQueueTransport(self.queues["west"]), delay, claims=self.claims
        )
        self.transports.append(geo)  # its bounded view of the claim log has a pool of its own
        return geo

    def start(self, region: str, hang_on: str = "") -> None:
        ctx.set_forkserver_preload(PRELOAD)
        p = ctx.Process(
            target=w.run_region,
            args=(
                region,
                self.urls[region],
                self.urls["claims"],
                self.effects_path,
                str(self.root),
            ),
            kwargs={"hang_on": hang_on},
        )
        p.start()
        self.procs[region] = p

    def wait_ready(self) -> None:
        for region in self.procs:
            wait_for(lambda r=region: (self.root / f"ready-{r}").exists(), f"{region} ready")

    def send_all(self, geo: GeoReplicatedTransport) -> float:
        started = time.time()
        for i in range(1, PER_SESSION + 1):
            for s in range(SESSIONS):
                geo.send(
                    [
                        TransportMessage(
                            message_id=f"s{s}-{i}",
                            destination=w.QUEUE,
                            body=json.dumps({"i": i}).encode(),
                            session_id=f"s{s}",
                        )
                    ]
                )
        return started

    def count(self, table: Any) -> int:
        with self.effects.connect() as c:
            return int(c.execute(select(func.count()).select_from(table)).scalar_one())

    def done(self, regions: tuple[str, ...] = ("east", "west")) -> bool:
        """Every message's effect recorded, and every copy in ``regions`` settled."""
        return self.count(w.effects) == TOTAL and all(not self.queues[r].stats() for r in regions)

    def effect_at(self, message_id: str) -> tuple[str, float]:
        with self.effects.connect() as c:
            row = c.execute(
                select(w.effects.c.region, w.effects.c.at).where(
                    w.effects.c.message_id == message_id
                )
            ).one()
        return str(row.region), float(row.at)

    def report(self, scenario: str, latency: float | None = None) -> Report:
        with self.effects.connect() as c:
            rows = c.execute(
                select(w.calls.c.region, func.count()).group_by(w.calls.c.region)
            ).all()
        return Report(
            scenario,
            TOTAL,
            {str(r): int(n) for r, n in rows},
            self.count(w.duplicates),
            self.count(w.violations),
            TOTAL - self.count(w.effects),
            latency,
        )

    def close(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # the test is over: no graceful stop to wait for
        for p in self.procs.values():
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join()
        for geo in self.transports:
            geo.close()
        for q in self.queues.values():
            q.close()
        self.claims.close()
        self.effects.dispose()


def wait_for(condition: Any, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


NAMES = ("east", "west", "claims")


@pytest.fixture
def pg_regions(tmp_path: Path, pg_server: Any) -> Iterator[Regions]:
    """The regions' queues and the claim log as three databases on the PostgreSQL server."""
    if isinstance(pg_server, str):
        pytest.skip("three databases are needed; OUTBOX_TEST_PG_URL names only one")
    import psycopg

    stamp = f"{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    template = f"geo_template_{stamp}"
    upgrade(pg_server.create_database(template))  # migrated once, then copied three times
    with psycopg.connect(
        f"host=127.0.0.1 port={pg_server.port} user=outbox dbname=postgres", autocommit=True
    ) as c:
        for n in NAMES:
            c.execute(f'CREATE DATABASE "geo_{n}_{stamp}" TEMPLATE "{template}"')
    base = f"postgresql+psycopg://outbox@127.0.0.1:{pg_server.port}"
    r = Regions(tmp_path, {n: f"{base}/geo_{n}_{stamp}" for n in NAMES})
    yield r
    r.close()


@pytest.fixture
def regions(tmp_path: Path, migrated_sqlite: Any) -> Iterator[Regions]:
    r = Regions(tmp_path, {n: migrated_sqlite(tmp_path / f"{n}.db") for n in NAMES})
    yield r
    r.close()


def _check(report: Report) -> None:
    print(report.line())
    assert report.duplicates == 0, report.line()
    assert report.order_violations == 0, report.line()
    assert report.lost == 0, report.line()


def test_normal_the_primary_handles_everything(regions: Regions) -> None:
    t0 = time.monotonic()
    regions.start("east")
    regions.start("west")
    regions.wait_ready()
    t1 = time.monotonic()
    regions.send_all(regions.geo(delay=NORMAL_DELAY))
    t2 = time.monotonic()
    wait_for(regions.done, "every message handled and every copy settled")
    print(f"start {t1 - t0:.2f}s send {t2 - t1:.2f}s drain {time.monotonic() - t2:.2f}s")
    report = regions.report("normal")
    _check(report)
    assert report.handler_calls == {"east": TOTAL}  # the secondary completed its copies unhandled


def test_the_primary_queue_unavailable_the_secondary_handles_everything(
    regions: Regions,
) -> None:
    regions.start("east")
    regions.start("west")
    regions.wait_ready()
    sent = regions.send_all(regions.geo(primary_down=True))
    wait_for(regions.done, "every message handled")
    first = min(regions.effect_at(f"s{s}-1")[1] for s in range(SESSIONS))
    report = regions.report("primary queue unavailable", first - sent)
    _check(report)
    assert report.handler_calls == {"west": TOTAL}
    assert report.failover_latency is not None
    assert report.failover_latency >= DELAY - 0.1  # not before the secondary copy is due


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_primary_consumer_killed_inside_a_handler(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """On SQLite files, and on three PostgreSQL databases (two queues and the claim log)."""
    regions: Regions = request.getfixturevalue("regions" if backend == "sqlite" else "pg_regions")
    regions.start("east", hang_on="s0-2")
    regions.start("west")
    regions.wait_ready()
    regions.send_all(regions.geo())
    wait_for((regions.root / "hung").exists, "east inside the handler of s0-2")
    killed = time.time()
    os.kill(regions.procs["east"].pid, signal.SIGKILL)
    wait_for(lambda: regions.done(("west",)), "the secondary finishing every message")
    region, at = regions.effect_at("s0-2")
    report = regions.report(f"primary SIGKILLed in a handler ({backend})", at - killed)
    _check(report)
    assert region == "west"
    assert report.failover_latency is not None
    # the other region takes over once the claim's lease (renewed until the kill) runs out
    assert report.failover_latency <= w.LEASE + 5.0  # slack for a loaded machine


def test_the_claim_log_unavailable_for_a_while(regions: Regions) -> None:
    geo = regions.geo()
    regions.send_all(geo)  # the sender registers the order first: the log is up
    lock = sqlite3.connect(str(regions.root / "claims.db"), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # no claim can be written: nothing may be handled
    regions.start("east")
    regions.start("west")
    regions.wait_ready()
    outage_end = time.monotonic() + DELAY + 0.5  # past secondary_delay: both regions try
    while time.monotonic() < outage_end:
        assert regions.count(w.calls) == 0, "a handler ran without a claim"
        time.sleep(0.05)
    lock.execute("ROLLBACK")
    lock.close()
    wait_for(regions.done, "every message handled after the outage")
    _check(regions.report("claim log unavailable"))

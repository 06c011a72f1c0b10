"""``outbox demo geo``: the shipment story across two regions, with a region failing mid-run.

Packages get three ordered status updates. The outbox sends every update to both regions' queues
(``GeoReplicatedTransport``: the west copy ``secondary_delay`` later) and registers each package's
order in one claim log; a consumer per region handles each update once, in order
(``Consumer(claims=...)``). After the first status the east region fails: its queue refuses sends
and its consumer stops. The last two statuses reach the west region only, and its consumer takes
over once they are due. The summary says who handled what and checks every package's statuses
were handled once each and in order.

Why threads, not processes: the regions' failover is the story here, and each region is a queue
file of its own; the multi-process proof (SIGKILL inside a handler) is tests/claims/.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.app.demos.frame import Step, StoryReport, cleanup, closing_rows, story_workspace
from outbox.app.demos.shipments import DESTINATION, STATUSES, _save_status, package_id
from outbox.core.errors import RetryableTransportError

if TYPE_CHECKING:
    from dispatcher.transports.base import Transport, TransportMessage

REGIONS = ("east", "west")
SECONDARY_DELAY = 1.5  # seconds: short, so the demo shows the failover without waiting long
CLAIM_LEASE = 3.0
DEADLINE = 45.0


@dataclass
class GeoDemoReport(StoryReport):
    packages: int
    written: int = 0
    handled: int = 0  # distinct status updates whose effect was recorded
    handler_calls: dict[str, int] = field(default_factory=dict)
    copies_completed_unhandled: dict[str, int] = field(default_factory=dict)
    duplicate_effects: int = 0
    order_violations: int = 0
    sends_missed_by_east: int = 0
    failed_region: str = "east"
    failover_s: float | None = None  # east failed -> west's first handling after that
    packages_in_order: int = 0


class _Effects:
    """The consumers' side effects: each package's handled steps, in handling order."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.steps: dict[str, list[int]] = {}
        self.calls = {r: 0 for r in REGIONS}
        self.seen: set[str] = set()
        self.duplicates = 0
        self.violations = 0
        self.failed_at: float | None = None  # when east failed
        #: each region's first handling after east failed (west may handle some copies of the
        #: first status before: its copies fall due while a large first save is still running)
        self.first_after_failure: dict[str, float] = {}

    def handler(self, region: str) -> Callable[[Any], None]:
        def handle(m: Any) -> None:
            body = json.loads(m.body)
            with self.guard:
                self.calls[region] += 1
                if self.failed_at is not None:
                    self.first_after_failure.setdefault(region, time.monotonic())
                if m.message_id in self.seen:
                    self.duplicates += 1
                    return
                self.seen.add(m.message_id)
                steps = self.steps.setdefault(str(body["package"]), [])
                if int(body["step"]) != len(steps) + 1:
                    self.violations += 1
                steps.append(int(body["step"]))

        return handle


class _FailingRegion:
    """A region's transport that the story fails on purpose: after ``fail()`` every send is
    refused as a region that is down would refuse it. Why not the kit's ``FaultyTransport``: its
    refusal tells a test to call ``outage(False)``, and the geo transport logs that hint as a
    warning the person watching the demo cannot act on; this one says what happened."""

    atomic_batches = True  # as the SQL queue transport it wraps

    def __init__(self, inner: Transport, name: str) -> None:
        self.inner = inner
        self.name = name
        self.failed = False

    def fail(self) -> None:
        self.failed = True

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if self.failed:
            raise RetryableTransportError(
                f"region {self.name} is down (the demo failed it on purpose)",
                message_id=batch[0].message_id if batch else None,
                hint="none needed: the other region holds every message this one misses, and "
                "its consumer takes them over",
            )
        self.inner.send(batch)

    def close(self) -> None:
        self.inner.close()


class _Regions:
    """The two regions: a queue file each (east's transport can fail), the shared claim log, the
    geo transport over them, and a consumer thread per region."""

    def __init__(self, root: Path, effects: _Effects) -> None:
        from dispatcher.claims.sql import SqlClaimLog
        from dispatcher.queue import Consumer, ConsumerOptions, SqlQueue
        from dispatcher.transports.geo import GeoReplicatedTransport
        from dispatcher.transports.sql import SqlQueueTransport
        from migrations.sql import upgrade

        root.mkdir(parents=True, exist_ok=True)
        urls = {name: f"sqlite:///{root / name}.db" for name in (*REGIONS, "claims")}
        for url in urls.values():
            upgrade(url)
        self.queues = {r: SqlQueue(urls[r], max_delivery_count=10_000) for r in REGIONS}
        self.claims = SqlClaimLog(urls["claims"])
        self.east = _FailingRegion(SqlQueueTransport(self.queues["east"]), "east")
        self.geo = GeoReplicatedTransport(
            self.east,
            SqlQueueTransport(self.queues["west"]),
            SECONDARY_DELAY,
            claims=self.claims,
            names=REGIONS,
        )
        options = ConsumerOptions(
            claims=self.claims,
            claim_lease=CLAIM_LEASE,
            look_again=0.2,
            poll_interval=0.05,
            renew_check_interval=0.2,
            backoff=lambda _n: 0.2,
        )
        self.consumers = {
            r: Consumer(
                self.queues[r], DESTINATION, effects.handler(r), options=options, claim_owner=r
            )
            for r in REGIONS
        }
        self.threads = {
            r: threading.Thread(target=c.run_forever, name=f"consumer-{r}", daemon=True)
            for r, c in self.consumers.items()
        }
        for t in self.threads.values():
            t.start()

    def stop(self, region: str) -> None:
        self.consumers[region].stop()
        self.threads[region].join(30)

    def stop_all(self) -> None:
        """Every consumer still running (the story was cut short: Ctrl-C)."""
        for region, thread in self.threads.items():
            if thread.is_alive():
                self.stop(region)

    def close(self) -> None:
        self.geo.close()
        self.claims.close()
        for q in self.queues.values():
            q.close()


def run_geo_demo(workspace: str | Path | None, *, packages: int = 40, step: Step) -> GeoDemoReport:
    """Play the two-region story in ``workspace`` (a temporary folder, removed after, if None)."""
    from outbox.app.facade import Outbox

    effects = _Effects()
    frame = story_workspace(workspace, "outbox-geo-demo-", GeoDemoReport, packages=packages)
    with frame as (ws, report), cleanup() as resources:
        regions = _Regions(ws / "regions", effects)
        resources.callback(regions.close)
        resources.callback(regions.stop_all)  # before the queues close
        step(
            f"two regions in {ws / 'regions'}: queues east.db and west.db, claim log claims.db; "
            f"west copies due {SECONDARY_DELAY:g}s after east's"
        )
        ob = Outbox.open(ws, transport=regions.geo)
        resources.callback(ob.close)
        _save(ob, packages, 0)
        report.written = packages
        step(f"saved '{STATUSES[0]}' for {packages} packages: sent to both regions")

        def handled() -> int:
            return len(effects.seen)

        _wait(lambda: handled() >= packages, report, "the first status handled", handled)
        with effects.guard:
            effects.failed_at = failed_at = time.monotonic()
        regions.east.fail()
        regions.stop("east")
        step("region east fails: its queue refuses sends and its consumer stops")
        for s in (1, 2):
            _save(ob, packages, s)
        report.written = 3 * packages
        step(f"saved '{STATUSES[1]}' and '{STATUSES[2]}': west holds them, due after the delay")
        _wait(lambda: handled() >= 3 * packages, report, "every status handled", handled)
        west_stats = regions.queues["west"].stats
        _wait(lambda: not west_stats(), report, "every west copy settled", west_stats)
        regions.stop("west")
        west_first = effects.first_after_failure.get("west")
        report.failover_s = round(west_first - failed_at, 2) if west_first else None
        report.sends_missed_by_east = regions.geo.missed[0]
        for r, c in regions.consumers.items():
            assert c.claimed is not None
            report.copies_completed_unhandled[r] = c.claimed.duplicates
        _verify(report, effects, packages)
    return report


def _save(ob: Any, packages: int, status: int) -> None:
    for lo in range(0, packages, 10):
        _save_status(ob, range(lo, min(packages, lo + 10)), status)


def _wait(
    done: Callable[[], bool],
    report: GeoDemoReport,
    what: str,
    progress: Callable[[], object] = lambda: None,
) -> None:
    """Wait for ``done``; give up only after ``DEADLINE`` seconds without ``progress`` changing,
    so a large ``--packages`` run is slow, not reported as a loss."""
    deadline, last = time.monotonic() + DEADLINE, progress()
    while not done():
        now = progress()
        if now != last:
            deadline, last = time.monotonic() + DEADLINE, now
        if time.monotonic() > deadline:
            report.problems.append(f"timed out waiting for {what} (no progress for {DEADLINE:g}s)")
            return
        time.sleep(0.05)


def _verify(report: GeoDemoReport, effects: _Effects, packages: int) -> None:
    with effects.guard:
        report.handled = len(effects.seen)
        report.handler_calls = dict(effects.calls)
        report.duplicate_effects = effects.duplicates
        report.order_violations = effects.violations
        in_order = [effects.steps.get(package_id(i)) == [1, 2, 3] for i in range(packages)]
    report.packages_in_order = sum(in_order)
    report.invariants = {
        "every status handled (nothing lost)": report.handled == 3 * packages,
        "each handled once (no duplicate effect)": report.duplicate_effects == 0,
        "in order per package, across regions": report.order_violations == 0 and all(in_order),
    }


def iter_rows(report: GeoDemoReport) -> Iterator[tuple[str, str]]:
    """The summary table's rows."""
    yield "packages", str(report.packages)
    yield "status updates written", str(report.written)
    yield "handled (distinct)", str(report.handled)
    yield "handler calls", ", ".join(f"{r} {n}" for r, n in report.handler_calls.items())
    yield (
        "copies completed without the handler",
        ", ".join(f"{r} {n}" for r, n in report.copies_completed_unhandled.items()),
    )
    yield "sends east missed (settled on west)", str(report.sends_missed_by_east)
    if report.failover_s is None:
        yield "failover", "east failed; west handled nothing after that"
    else:
        yield "failover", f"east failed; west handled its next update {report.failover_s:g}s later"
    yield "duplicate effects", str(report.duplicate_effects)
    yield "packages with statuses in order", f"{report.packages_in_order}/{report.packages}"
    yield from closing_rows(report)

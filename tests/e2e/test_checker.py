"""The randomized end-to-end checker on a fixed set of seeds, the demo, and ``outbox status``.

Each seed is a different fault plan (crash points raised or SIGKILLed in writer and worker
processes, SIGKILLs from outside, broker outages, send failures, commit conflicts on few buckets);
a failure names its seed, and ``outbox check --first-seed N --seeds 1 --workdir DIR`` replays it
and keeps every log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from tests.e2e.conftest import CheckPool, RunSeed, seed_runner

#: 11 seeds on every run: the soak's 1,000 seeds (``benchmarks/results/checker_soak.json``) give
#: the breadth; these keep each CI run honest. They were 50 until the suite passed 40 minutes
#: (issue 42's close), then 1-24, then 12 of those 24 (3 4 5 8 10 12 14 16 18 21 22 23). These
#: 11 of the soak's seeds 2001-3000 (each held every invariant and fired every fault there) still
#: place every fault the 24 placed (``_plan_features``: each writer and worker crash point with
#: each action, both kill roles, 0-2 outages, 1/2/4 buckets, every send-failure, latency,
#: rescue-failure and private-round setting, 2-3 writers, 1-2 workers) with fewer processes:
#: 36 writers and workers where the 12 started 47 (a seed's time follows its processes, its
#: writer kills and its crash points, hardly its rounds: a least-squares fit of the soak's seed
#: durations), issue 43's suite time. 11 is the least: only worker 0 crashes, so a seed places
#: one of the 11 worker crash points with its action. Pinned below.
SEEDS = [2142, 2155, 2257, 2376, 2396, 2415, 2482, 2574, 2717, 2796, 2912]
CI_SCALE = 0.5  # 3-4 rounds per writer: every fault still fires, a seed takes a few seconds


@pytest.fixture(scope="session")
def ci_seed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    check_pool: CheckPool,
) -> Iterator[RunSeed]:
    """Runs the CI seeds, ``SEED_JOBS`` at a time, from the first test on."""
    yield from seed_runner(
        request,
        tmp_path_factory,
        name="checker-seeds",
        test_name="test_seed_holds_every_invariant",
        kwargs={"scale": CI_SCALE, "drain_timeout": 60},
        shared=check_pool,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)  # includes waiting for the seeds submitted before this one
@pytest.mark.parametrize("seed", SEEDS)
def test_seed_holds_every_invariant(seed: int, ci_seed: RunSeed) -> None:
    report = ci_seed(seed)
    assert report.ok, report.summary()
    assert report.rescue_errors == []
    # every planned fault fired: a crash point never hit or a kill that found its victim dead
    # would make this seed prove less than its plan says
    assert report.faults, report.to_dict()
    assert report.unfired_faults == [], report.to_dict()
    # the rescuer found documents still pending (a stranded round per seed) and commanded them.
    # Not always first to deliver them: since the worker sends every paused key's gate with each
    # batch (issue 42), a stranded document that gates a key may go out with another command's
    # batch before the rescuer's command arrives (seed 42 at this scale). The mutation
    # rescuer-enqueues-nothing proves the rescuer is needed (I1).
    assert report.rescue_commands > 0, report.to_dict()
    assert report.drained, report.to_dict()
    assert report.invariants, report.to_dict()
    assert all(report.invariants.values()), report.to_dict()
    # exact accounting: every committed message delivered at least once, nothing else delivered
    assert report.committed > 0
    assert report.first_by_immediate + report.first_by_worker == report.committed
    assert report.deliveries == report.committed + report.duplicates
    assert report.lost == report.out_of_order == report.phantoms == report.mismatched == []
    assert report.saves_failed == []
    assert report.watermark_regressions == []
    # the deletes (every seed's writers delete, and the supervisor's two delete steps): the
    # current documents match the feed's model, the re-create rule held, the supervisor's
    # deletes left a kept tombstone and a new life, and its create over the unsent tombstone
    # was refused (these ran as three seeds of their own in test_checker_delete until issue
    # 43's suite time: the CI seeds place every delete kind they placed, pinned below)
    assert report.documents_mismatched == []
    assert report.delete_violations == []
    assert report.tombstones >= 2, report.to_dict()
    assert report.new_lives >= 1, report.to_dict()
    assert report.creates_refused >= 1, report.to_dict()
    assert report.documents_deleted >= 1, report.to_dict()
    assert report.documents_current > 0, report.to_dict()


@pytest.mark.slow
def test_demo_tells_the_story_and_every_invariant_holds(tmp_path: Path) -> None:
    ws = tmp_path / "demo"
    result = CliRunner().invoke(
        main, ["demo", "--workspace", str(ws), "--packages", "12", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["written"] == report["delivered"] == 36
    assert report["duplicates"] == 0
    assert report["dispatcher_exit"] == -9
    assert report["pending_after_crash"] == 12
    assert report["packages_in_order"] == 12
    # The demo runs on the wall clock (plus the time it simulates): on a quiet machine the first
    # pass finds nothing past the 15 s rescue delay and the second, after the clock is moved,
    # enqueues the 12; with both cores busy the commit can be past the delay by the first pass,
    # which then enqueues them itself and the demo moves no clock. Either way, exactly the 12.
    enqueued = [p["commands_enqueued"] for p in report["rescue_passes"]]
    assert enqueued in ([0, 12], [12]), enqueued
    assert all(report["invariants"].values())

    status = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
    assert status.exit_code == 0, status.output
    data = json.loads(status.stdout)
    assert data["pending_documents"] == 0
    assert data["checkpoints"][0]["lag_versions"] <= 1  # the worker's watermark commit

    again = CliRunner().invoke(main, ["demo", "--workspace", str(ws)])
    assert again.exit_code == 1
    assert again.stderr.strip() == (
        f"error: demo workspace {ws} is not an empty folder (fix: pass a new folder to "
        "-w/--workspace, or omit it for a temporary one)"
    )


def test_status_health_checks(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from dispatcher.transports.memory import InMemoryTransport
    from outbox.app.facade import Outbox
    from outbox.core.clock import ManualClock
    from outbox.testing.faulty import FaultyTransport

    ws = tmp_path / "ws"
    clock = ManualClock(datetime.now(UTC) - timedelta(minutes=10))
    faulty = FaultyTransport(InMemoryTransport(), clock=clock)
    faulty.outage()
    with Outbox.open(ws, clock=clock, transport=faulty, default_destination="d") as ob:
        with ob.unit_of_work() as uow:
            uow.create("pkg-1", type="Package").send("Left", {"at": "Seattle"})
            uow.create("pkg-2", type="Package").send("Left", {"at": "Seattle"})
        queue = ob.runtime.queue
        clock.advance(5)  # past the retry commands' schedule
        for msg in queue.receive(ob.settings.command_queue, 10):
            queue.dead_letter(msg, "PoisonMessage", "handler refused it")
    runner = CliRunner()
    ok = runner.invoke(main, ["-w", str(ws), "status", "--fail-if-pending-older-than", "1h"])
    assert ok.exit_code == 0, ok.output
    assert re.search(r"^pending documents +2$", ok.stdout, re.M)  # aligned plain text
    assert re.search(r"^pending messages +2$", ok.stdout, re.M)
    assert "PoisonMessage" in ok.stdout

    old = runner.invoke(main, ["-w", str(ws), "status", "--fail-if-pending-older-than", "5m"])
    assert old.exit_code == 3
    assert old.stderr.startswith("unhealthy: the oldest pending message (pkg-")
    # the commit is 10 minutes before the test started; status reads the real time since then
    assert re.search(r"\) is 10m0\ds old, over 5m00s\n$", old.stderr), old.stderr

    dead = runner.invoke(main, ["-w", str(ws), "status", "--fail-if-dead-letters", "--json"])
    assert dead.exit_code == 4
    data = json.loads(dead.stdout)
    assert data["oldest_dead_letter"]["reason"] == "PoisonMessage"
    assert {q["queue"]: q["dead_lettered"] for q in data["queues"]} == {"outbox-commands": 2}
    # the table's log: its creation (0), the unit of work, and the commits since; nothing trimmed
    assert data["oldest_log_version"] == 0
    assert data["log_files"] == data["table_version"] + 1
    assert re.search(r"^delta log +\d+ files from version 0$", ok.stdout, re.M)


def test_a_rescue_pass_that_breaks_unexpectedly_fails_the_seed() -> None:
    """Injected interruptions and ``OutboxError``s are retried by the next pass; anything else
    (a raw driver error, a rescuer bug) is recorded and fails the seed, whatever the invariants
    say."""
    from outbox.app.checker.report import CheckReport, aggregate
    from outbox.app.checker.rescue import InterruptedPass, run_rescue_pass
    from outbox.core.errors import QueueUnavailableError

    class Pass:
        def __init__(self, error: Exception | None) -> None:
            self.error = error

        def run(self) -> None:
            if self.error is not None:
                raise self.error

    report = CheckReport(
        seed=7, scenario="unit", drained=True, committed=1, invariants={"I1 no loss": True}
    )
    run_rescue_pass(Pass(None), report)
    run_rescue_pass(Pass(InterruptedPass("half")), report)
    run_rescue_pass(Pass(QueueUnavailableError("queue down")), report)
    assert report.ok
    assert (report.rescue_passes, report.rescue_passes_interrupted) == (3, 1)
    assert report.rescue_passes_failed == 1
    run_rescue_pass(Pass(OSError(5, "Input/output error")), report)
    run_rescue_pass(Pass(KeyError("last_seq")), report)
    assert report.rescue_errors == ["OSError: [Errno 5] Input/output error", "KeyError: 'last_seq'"]
    assert not report.ok
    assert "2 unexpected rescue error(s), first: OSError" in report.summary()
    total = aggregate([report])
    assert total["failed_seeds"] == [7]
    assert total["rescue_errors"] == 2


def test_nothing_committed_is_not_ok() -> None:
    from outbox.app.checker.report import CheckReport

    report = CheckReport(seed=8, scenario="unit", drained=True, invariants={"I1 no loss": True})
    assert not report.ok
    assert "NOTHING COMMITTED" in report.summary()
    assert not CheckReport(seed=9, scenario="unit", drained=True, committed=3).ok  # no verdict


def test_every_ci_plan_strands_a_round_and_places_its_faults() -> None:
    """The plans themselves: each CI seed needs the rescuer and has faults to fire."""
    from outbox.app.checker.scenario import Scenario

    for seed in SEEDS:
        sc = Scenario.from_seed(seed, scale=CI_SCALE)
        assert any(w.stranded for w in sc.writers), sc.describe()
        assert sc.kills, sc.describe()
        for k in sc.kills:
            if k.role == "writer":
                assert 1 <= k.after_round < sc.writers[k.index].rounds, sc.describe()
        assert [w.crash for w in sc.workers[1:]] == [""] * (len(sc.workers) - 1)


def _plan_features(seed: int) -> set[tuple[object, ...]]:
    """What a seed's plan exercises: its crash points with their actions, its kills' roles, the
    settings drawn per seed, and its writers' delete kinds, re-created or not."""
    from outbox.app.checker.scenario import Scenario

    sc = Scenario.from_seed(seed, scale=CI_SCALE)
    out: set[tuple[object, ...]] = {
        ("delete", d.kind, d.recreate) for w in sc.writers for d in w.deletes
    }
    for role, plans in (("writer", sc.writers), ("worker", sc.workers)):
        for p in plans:
            if p.crash:
                point, _, action = p.crash.partition("=")
                out.add((role, point.partition("@")[0], action))
    out |= {("kill", k.role) for k in sc.kills}
    out |= {
        ("outages", len(sc.outages)),
        ("buckets", sc.buckets),
        ("send failure rate", sc.failure_rate),
        ("latency", sc.latency_ms),
        ("rescue failure rate", sc.rescue_failure_rate),
        ("private share", sc.private_share),
        ("writers", len(sc.writers)),
        ("workers", len(sc.workers)),
    }
    return out


#: The seeds test_checker_delete ran on their own (issue 44) until issue 43's suite time.
DELETE_SEEDS = (2, 7, 9)


def test_the_ci_seeds_place_every_fault_the_24_seeds_placed() -> None:
    """SEEDS were cut from 1-24 to 12, then to 11 of the soak's (suite time): each cut kept
    every crash point with every action, kill role and setting the 24 placed, so no fault left
    the CI run. Every writer crash point is there with each action; the workers'
    ``during_watermark=kill`` was in none of the 24 (the soak places it). Every delete kind,
    re-created and not, is placed: the delete seeds (``DELETE_SEEDS``) placed nothing more."""
    from outbox.app.checker.scenario import ACTIONS, DELETE_KINDS, WORKER_POINTS, WRITER_POINTS

    placed = set().union(*(_plan_features(s) for s in SEEDS))
    assert set().union(*(_plan_features(s) for s in range(1, 25))) <= placed
    assert set().union(*(_plan_features(s) for s in DELETE_SEEDS)) <= placed
    assert {("delete", k, r) for k in DELETE_KINDS for r in (False, True)} <= placed
    assert {("writer", p, a) for p in WRITER_POINTS for a in ACTIONS} <= placed
    missing = {("worker", p, a) for p in WORKER_POINTS for a in ACTIONS} - placed
    assert missing == {("worker", "during_watermark", "kill")}, missing

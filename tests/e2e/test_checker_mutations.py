"""The checker must be able to fail: each deliberately broken build
(``outbox.app.checker.mutations``) runs one seed and must be caught, by the invariant (or report
field) that names the bug.

Writer and worker mutations are applied inside the checker's child processes (the mutation's name
travels in their configuration); rescuer mutations wrap the supervisor's own rescuer and sink, or
break the production rescuer's code (its pass, sink or planner) in the supervisor for the seed.

The broken builds' seeds run in the CI seeds' process pool, four at a time (``broken_builds``,
``check_pool``): a broken build's seed is mostly waiting (a build that loses messages never
drains: its drain ends once it is stuck, or after 8 s), and one after another they took about
200 s of a CI run. Each supervisor breaks the production rescuer in its own pool process, for
its seed only, so two builds never meet. The delete's two builds (issue 44) joined them from
``test_checker_delete`` (issue 43's suite time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outbox.app.checker.mutations import MUTATIONS
from outbox.app.checker.report import CheckReport
from outbox.app.checker.run import run_check
from outbox.app.checker.scenario import Scenario
from tests.e2e.conftest import CheckPool, coverage_of_this_process

#: The seed every broken build runs, chosen by its plan: each build's effect is forced by what
#: the plan makes happen, not by timing (``test_the_seed_forces_every_broken_builds_effect``).
#: Seed 4, used before issue 42, left three of them to chance.
SEED = 598
SCALE = 0.5
#: A broken build's seed took 113 s on a 2-core machine at load 20 (issue 42), 15-30 s at rest.
#: The pool runs the builds in the tests' order, so a test waits for about one build at most:
#: the one before it was done when the test before it ended.
LIMIT = 300

#: The builds run in the pool (``""``: the intact build), each by the test named: the tests
#: collected submit theirs, in their order, when the first of them starts, so ``-k`` still runs
#: one alone. The builds that drain twice come first (their tests too): the longest runs.
BUILDS = {
    "test_the_intact_build_survives_the_delete_and_re_create": "",
    # the delete's two (issue 44) drain to the end as the intact build does: judged with every
    # other invariant holding
    "test_readers_that_show_tombstones_are_caught": "readers-show-tombstones",
    "test_a_fold_that_removes_an_unsent_tombstone_loses_its_last_message": (
        "fold-removes-unsent-tombstones"
    ),
    "test_a_rescuer_that_enqueues_nothing_loses_the_stranded_messages": "rescuer-enqueues-nothing",
    "test_a_rescue_pass_that_checkpoints_past_its_window_loses_the_young_tail": (
        "rescue-checkpoint-past-window"
    ),
    "test_a_production_sink_that_swallows_a_command_loses_its_document": "rescue-sink-swallows-one",
    "test_a_planner_off_by_one_never_rescues_a_document_with_one_pending_message": (
        "rescue-planner-off-by-one"
    ),
    "test_ids_without_the_incarnation_lose_the_re_created_documents_messages": (
        "ids-ignore-incarnation"
    ),
    "test_a_watermark_merge_that_lowers_is_a_regression": "watermark-lowers",
    "test_a_transport_that_reorders_breaks_order": "transport-reorders",
    "test_sending_before_the_commit_delivers_phantoms": "sends-before-commit",
    "test_a_rescuer_that_raises_fails_the_seed": "rescuer-raises",
    "test_writers_that_die_at_start_commit_nothing_and_are_not_ok": "writers-die-at-start",
}


#: The builds whose verdict needs every drain to finish.
FULL_DRAIN = ("", "readers-show-tombstones", "fold-removes-unsent-tombstones")


class BrokenBuilds:
    """The pool's runs of ``SEED``, one per build, each in a folder of its own."""

    def __init__(self, workdir: Path, pool: CheckPool) -> None:
        self.workdir, self.pool = workdir, pool
        self.measure = coverage_of_this_process()

    def folder(self, mutation: str) -> Path:
        return self.workdir / (mutation or "intact")

    def submit(self, mutation: str) -> None:
        # The intact build must drain completely twice: give it the CI seeds' drain time, not
        # the short one the broken builds get (they are judged on what they break, not on
        # draining; a build's drain also ends once it is stuck: ``execute.drain``). The
        # delete's builds are judged on a seed that drained.
        drain = 60 if mutation in FULL_DRAIN else 8
        # A broken build's folder is kept even when its seed passes: that is when ``_who_delivered``
        # must read its broker log (the build escaped).
        kwargs = {
            "scale": SCALE,
            "drain_timeout": drain,
            "mutation": mutation,
            "keep": bool(mutation),
        }
        self.pool.submit(mutation, SEED, self.folder(mutation), kwargs, self.measure)

    def report(self, mutation: str) -> CheckReport:
        if not self.pool.submitted(mutation):
            self.submit(mutation)
        return self.pool.result(mutation)


@pytest.fixture(scope="module")
def broken_builds(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    check_pool: CheckPool,
) -> BrokenBuilds:
    """Every collected build's seed starts at once in the CI seeds' pool (``check_pool``). Each
    run is measured as this process is (``coverage_of_this_process``): the supervisor-side
    hooks of the broken builds run there."""
    collected = [
        item.originalname
        for item in request.session.items
        if getattr(getattr(item, "module", None), "__name__", None) == __name__
        and getattr(item, "originalname", None) in BUILDS
    ]
    builds = BrokenBuilds(tmp_path_factory.mktemp("checker-mutations"), check_pool)
    for name in collected:
        builds.submit(BUILDS[name])
    return builds


#: The pooled tests share the checker's seed worker under xdist: the fixture submits every
#: collected build, so a pool on each worker would run them all twice (``tests/conftest.py``).
pooled = pytest.mark.xdist_group("checker-seeds")


def _broken(report: CheckReport) -> list[str]:
    return [name for name, held in report.invariants.items() if not held]


def _who_delivered(folder: Path, prefix: str) -> str:
    """For a miss: who delivered the documents whose ids start with ``prefix`` (role, pid, time
    from the broker log the failed seed keeps), so a broken build that escaped says how."""
    from outbox.app.checker.broker import read_log

    log = read_log(folder / f"seed-{SEED}" / "broker.log")
    lines = [
        f"{d.message.session_id} by {d.role} {d.pid} at {d.at:.3f}"
        for d in log
        if str(d.message.session_id).startswith(prefix)
    ]
    return "; ".join(lines) or f"nothing delivered for {prefix}*"


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_the_intact_build_survives_the_delete_and_re_create(broken_builds: BrokenBuilds) -> None:
    report = broken_builds.report("")  # the CI seeds' drain time (``BrokenBuilds.submit``)
    assert report.ok, report.summary()
    assert report.faults["external delete and re-create of a dispatched document"]


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_readers_that_show_tombstones_are_caught(broken_builds: BrokenBuilds) -> None:
    """The supervisor's delete step leaves a tombstone in the table (every seed runs it), and
    the verdict reads the current documents through the broken definition."""
    report = broken_builds.report("readers-show-tombstones")
    assert not report.ok
    assert _broken(report) == ["documents"], report.summary()
    assert any(
        "returned, but the model has it deleted" in m for m in report.documents_mismatched
    ), report.documents_mismatched


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_fold_that_removes_an_unsent_tombstone_loses_its_last_message(
    broken_builds: BrokenBuilds,
) -> None:
    """The supervisor folds right after its delete, whose last message is surely unsent then."""
    report = broken_builds.report("fold-removes-unsent-tombstones")
    assert not report.ok
    assert "I1 no loss" in _broken(report), report.summary()
    assert report.lost, report.summary()
    # not a drain cut short: everything the table still holds was sent
    assert report.drained, report.summary()
    assert report.not_dispatched == [], report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_rescuer_that_enqueues_nothing_loses_the_stranded_messages(
    broken_builds: BrokenBuilds,
) -> None:
    report = broken_builds.report("rescuer-enqueues-nothing")
    assert not report.ok
    assert "I1 no loss" in _broken(report), report.summary()
    assert report.lost
    assert report.not_dispatched
    assert report.rescued_first_deliveries == 0


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_rescuer_that_raises_fails_the_seed(broken_builds: BrokenBuilds) -> None:
    report = broken_builds.report("rescuer-raises")
    assert not report.ok
    assert report.rescue_errors
    assert report.rescue_errors[0].startswith("MutationError: mutated rescuer")


# The production rescuer broken in each of its parts (issue 29, item 6): the checker runs
# ``RescuePass`` over the production engine and ``QueueSink``, so each must fail the seed.


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_rescue_pass_that_checkpoints_past_its_window_loses_the_young_tail(
    broken_builds: BrokenBuilds,
) -> None:
    report = broken_builds.report("rescue-checkpoint-past-window")
    assert not report.ok
    assert "I1 no loss" in _broken(report), report.summary()
    assert report.not_dispatched, report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_production_sink_that_swallows_a_command_loses_its_document(
    broken_builds: BrokenBuilds,
) -> None:
    """``QueueSink`` itself is broken: caught only because the checker's rescuer sends through
    it (a sink of the checker's own, as before issue 29, passed this seed)."""
    report = broken_builds.report("rescue-sink-swallows-one")
    # The last writer's stranded round (writer 1, round 1: w1-s1-0 and w1-s1-1 at this scale):
    # its greatest id sorts last in every pass, so its command is the one swallowed. Before
    # stranded rounds dropped their key holds, a worker's batch sent it with any other command
    # and the build was caught only by a mark a late SIGKILL lost (it escaped under load).
    who = _who_delivered(broken_builds.folder("rescue-sink-swallows-one"), "w1-s1-")
    assert not report.ok, f"{report.summary()}; {who}"
    assert "I1 no loss" in _broken(report), report.summary()
    assert [d for d in report.not_dispatched if "w1-s1-1" in d], f"{report.summary()}; {who}"
    assert report.not_dispatched, report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_planner_off_by_one_never_rescues_a_document_with_one_pending_message(
    broken_builds: BrokenBuilds,
) -> None:
    report = broken_builds.report("rescue-planner-off-by-one")
    assert not report.ok
    assert "I1 no loss" in _broken(report), (
        report.summary()
        + "; "
        + _who_delivered(broken_builds.folder("rescue-planner-off-by-one"), "w0-s0-")
    )
    assert report.not_dispatched, report.summary()


def test_the_checker_runs_the_production_rescuer(tmp_path: Path) -> None:
    """What ``outbox rescue`` builds, wrapped only where the checker must: the sink's queue
    records what it accepted, the sink may die mid-pass, the clock runs ahead."""
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.app.checker.backends import seed_database
    from outbox.app.checker.rescue import FlakySink, PassClock, RecordingQueue
    from outbox.app.checker.run import _prepare
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import SqlCheckpointStore
    from rescuer.runner import RescuePass
    from rescuer.sink import QueueSink

    sc = Scenario.from_seed(SEED, scale=SCALE)
    report = CheckReport(seed=SEED, scenario=sc.describe())
    root = tmp_path / "seed"
    root.mkdir()
    run, recording, close = _prepare(
        sc,
        report,
        root,
        mutation="",
        broken=None,
        say=lambda _m: None,
        db=seed_database("sqlite", SEED),
    )
    try:
        rescuer = run.rescuer
        assert type(rescuer) is RescuePass
        assert type(rescuer.engine) is LocalEngine
        assert type(rescuer.checkpoints) is SqlCheckpointStore
        assert type(rescuer.clock) is PassClock
        assert rescuer.clock.store is rescuer.store  # the store the pass refreshes
        assert rescuer.name == run.settings.rescuer_name
        assert type(rescuer.sink) is FlakySink
        production = rescuer.sink.inner
        assert type(production) is QueueSink
        assert type(recording) is RecordingQueue
        assert production.queue is recording
        assert recording.queue is run.queue
        assert type(run.queue) is SqlQueue
    finally:
        close()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_transport_that_reorders_breaks_order(broken_builds: BrokenBuilds) -> None:
    report = broken_builds.report("transport-reorders")
    assert not report.ok
    assert "I2 order" in _broken(report), report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_sending_before_the_commit_delivers_phantoms(broken_builds: BrokenBuilds) -> None:
    """The conflicted round's first save sends, then loses its race: the premature send carries
    the id of the message that won, with other content. The seed's plan makes that send reach
    the broker (no send failures, no outage, writer 0 never crashes or is killed, and its
    conflicted round is on its own documents): one seed, where three used to be tried."""
    report = broken_builds.report("sends-before-commit")
    assert not report.ok
    assert "I3 no phantom" in _broken(report), report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_a_watermark_merge_that_lowers_is_a_regression(broken_builds: BrokenBuilds) -> None:
    report = broken_builds.report("watermark-lowers")
    assert not report.ok
    assert "I4 no interference" in _broken(report), report.summary()
    assert report.watermark_regressions


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_writers_that_die_at_start_commit_nothing_and_are_not_ok(
    broken_builds: BrokenBuilds,
) -> None:
    report = broken_builds.report("writers-die-at-start")
    assert report.committed == 0
    assert not report.ok
    assert "NOTHING COMMITTED" in report.summary()


@pytest.mark.slow
@pooled
@pytest.mark.timeout(LIMIT)
def test_ids_without_the_incarnation_lose_the_re_created_documents_messages(
    broken_builds: BrokenBuilds,
) -> None:
    """The delete-and-re-create step: with ids from (table, id, seq) alone, the re-created
    document's messages carry the deleted one's ids (a dedup broker drops them).

    The step runs whether or not the 8 s drain before it finished (issue 42: on a loaded
    machine it did not, and the step used to be skipped), and both invariants are read from
    the table's feed, so neither needs the second drain to deliver anything."""
    report = broken_builds.report("ids-ignore-incarnation")
    assert report.faults["external delete and re-create of a dispatched document"], report.summary()
    assert not report.ok
    assert "I6 idempotence" in _broken(report), report.summary()
    assert "I1 no loss" in _broken(report), report.summary()


def _rounds(seed: int) -> list[list[Any]]:
    """Every writer's planned rounds, as the writer processes draw them."""
    import random

    from outbox.app.checker.procs import plan_rounds

    sc = Scenario.from_seed(seed, scale=SCALE)
    keys = ("pool", "private_share", "docs_per_round", "msgs_per_doc")
    out = []
    for w in sc.writers:
        cfg = {"index": w.index, "rounds": w.rounds, "stranded": w.stranded}
        cfg |= {"conflicted": w.conflicted, **{k: getattr(sc, k) for k in keys}}
        out.append(plan_rounds(cfg, random.Random(w.seed)))
    return out


def test_the_seed_forces_every_broken_builds_effect() -> None:
    """What ``SEED``'s plan guarantees, so that no broken build's effect waits on timing (issue
    42). The rescuer builds that need a young commit get it from the checker's clock (every
    commit is young to the first pass that sees it: ``test_checker_clock``); a broken
    ``watermark-lowers`` retries its lowering MERGE; ``ids-ignore-incarnation`` needs only the
    re-create step, which always runs, and the delete's two only the supervisor's delete
    steps, which every seed runs."""
    sc = Scenario.from_seed(SEED, scale=SCALE)
    rounds = _rounds(SEED)
    writer0 = sc.writers[0]
    # sends-before-commit, transport-reorders: writer 0's conflicted round sends what it saves
    # and no send fails; on its own documents, nothing else sends them in between; the round
    # gives its first document two messages in one batch (the competing one and its own)
    assert sc.failure_rate == 0.0, sc.describe()
    assert sc.outages == [], sc.describe()
    assert writer0.crash == "", sc.describe()
    assert not [k for k in sc.kills if k.role == "writer" and k.index == 0], sc.describe()
    conflicted = rounds[0][writer0.conflicted[0]]
    assert all(d.startswith("w0-") and "-s" not in d for d in conflicted.ids), conflicted
    # rescue-planner-off-by-one: a stranded round (only the rescuer delivers it) of writer 0,
    # never killed, with one message a document
    assert [r.msgs for r in rounds[0] if r.stranded] == [1], rounds[0]
    # rescue-sink-swallows-one: the last writer strands a round, and its documents' ids sort
    # after every other (the sink drops the last command of each enqueue)
    last = rounds[-1]
    stranded = [d for r in last for d in r.ids if r.stranded]
    others = [d for rs in rounds for r in rs for d in r.ids if d not in stranded]
    assert stranded, last
    assert max(stranded) > max(others), (stranded, others)


def test_every_mutation_has_a_test() -> None:
    names = {
        "rescuer-enqueues-nothing",
        "rescuer-raises",
        "rescue-checkpoint-past-window",
        "rescue-sink-swallows-one",
        "rescue-planner-off-by-one",
        "transport-reorders",
        "sends-before-commit",
        "watermark-lowers",
        "writers-die-at-start",
        "ids-ignore-incarnation",
        "readers-show-tombstones",
        "fold-removes-unsent-tombstones",
    }
    assert set(MUTATIONS) == names


def test_an_unknown_mutation_is_a_configuration_error(tmp_path: Path) -> None:
    from outbox.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="names no mutation"):
        run_check(1, tmp_path, mutation="nope")

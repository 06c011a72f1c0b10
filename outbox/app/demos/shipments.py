"""``outbox demo``: the shipment-tracking story, end to end, on the embedded defaults.

Packages get three ordered status updates (left Seattle, reached Des Moines, arrived Charlotte).
The first two are saved and dispatched normally. The third is one big save by a "hub scanner"
process, and its dispatcher is SIGKILLed between two send batches (the batch size is a third of
the packages or less, so there are always several): some messages went out, the watermark was
never written, the rest were never sent. The rescuer runs at once and (rightly) finds the commit
not old enough; then the clock is moved past its delay, it enqueues ``ProcessDocument`` commands,
the command worker sends what is pending, and a consumer drains the queue and checks that every
package's statuses arrived once each and in order.

Every sentence it prints is derived from what happened in this run, not from the script: with
thousands of packages the saves outlast the rescue delay before the rescuer's first pass, which
then (no checkpoint yet) sweeps the table as it is now, the hub scanner's documents included; it
says so, and no clock is moved.

Why a real child process and SIGKILL: an exception can be caught and cleaned up after; a killed
process runs no ``finally``, which is the case the outbox exists for. The child runs in a session
of its own, so a Ctrl-C at the terminal reaches only the demo, which kills the child and then
removes the folder (a child in the terminal's group printed a traceback of its own, and could
write into the removed folder). Why a moved clock: the rescuer's delay is at least 15 s (shorter
would race the live dispatcher); waiting for real would make the demo slow without showing
anything more. The output says which seconds were simulated.

Why one module: it is one story, read top to bottom (steps 1-5, then the check and the summary
rows); split by role, a reader would follow it across files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from outbox.app.demos.frame import Bar, Step, StoryReport, cleanup, closing_rows, story_workspace
from outbox.core.clock import SystemClock

STATUSES = ("left Seattle", "reached Des Moines", "arrived Charlotte")
DESTINATION = "shipments"
CRASH = "mid_batch@2=kill"  # SIGKILL between the 2nd and 3rd send batch of the hub scan
SEND_BATCH = 8  # at most this many messages per send batch in the hub scanner
SAVE_BATCH = 10  # packages per unit of work in the first two steps
HUB_SCAN_TIMEOUT = 120.0  # seconds the hub scanner may take before it is killed
#: The hub scanner's process: ``python -c HUB_SCANNER <workspace> <packages> <crash point>``.
HUB_SCANNER = (
    "import sys; from outbox.app.demos.shipments import hub_scanner; "
    "hub_scanner(sys.argv[1], int(sys.argv[2]), sys.argv[3])"
)


class DemoClock(SystemClock):
    """The wall clock plus ``skipped`` seconds: time the demo simulates instead of waiting."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.skipped)


@dataclass
class DemoReport(StoryReport):
    packages: int
    written: int = 0  # messages committed
    delivered: int = 0  # distinct messages the consumer received
    received: int = 0  # receipts, duplicates included
    duplicates: int = 0  # receipts of an already-received message id
    resends_dropped_by_queue: int = 0  # re-sends the SQL queue's duplicate detection dropped
    killed_at: str = ""
    dispatcher_exit: int | None = None
    send_batch: int = 0  # the hub scanner's messages per send batch
    pending_after_crash: int = 0  # documents with unsent messages right after the kill
    messages_pending_after_crash: int = 0
    rescue_passes: list[dict[str, Any]] = field(default_factory=list)
    rescued: int = 0  # pending messages delivered by the worker
    rescue_delay_s: float = 0.0
    simulated_s: float = 0.0
    max_rescue_latency_s: float = 0.0  # commit -> delivery, simulated seconds included
    packages_in_order: int = 0
    #: invariant -> why this run did not put it to the test (it held, but only vacuously)
    not_exercised: dict[str, str] = field(default_factory=dict)


def send_batch(packages: int) -> int:
    """Messages per send batch for the hub scanner: a third of the packages at most, so the
    crash point after the second batch always falls with messages still unsent."""
    return max(1, min(SEND_BATCH, packages // 3))


def hub_scanner(workspace: str, packages: int, crash: str) -> None:
    """The child process: save every "arrived Charlotte" in one commit; die while dispatching."""
    import logging

    from outbox.app.facade import Outbox
    from outbox.testing.crash_points import ENV_VAR, crash_points, install

    logging.basicConfig(level=logging.ERROR)
    install()
    crash_points.arm_from_env({ENV_VAR: crash})
    with Outbox.open(workspace, create=False) as ob:
        ob.runtime.dispatcher.max_batch_messages = send_batch(packages)
        ob.runtime.dispatcher.max_in_flight = 1  # batches one after another: the kill after the
        # second leaves the rest unsent (sends in parallel could all finish before it)
        _save_status(ob, range(packages), 2)


def package_id(i: int) -> str:
    return f"pkg-{i:04d}"


def _save_status(ob: Any, indexes: range, step: int) -> int:
    with ob.unit_of_work() as uow:
        ids = [package_id(i) for i in indexes]
        docs = uow.get_many(ids)
        for doc_id in ids:
            doc = docs.get(doc_id) or uow.create(doc_id, type="Package", state={})
            doc.state["status"] = STATUSES[step]
            doc.send(
                "PackageStatusChanged",
                {"package": doc_id, "step": step + 1, "status": STATUSES[step]},
                destination=DESTINATION,
            )
    return len(indexes)


@dataclass
class _Story:
    """What the demo's steps share: the application's outbox, the clock, the report."""

    ob: Any
    clock: DemoClock
    report: DemoReport
    step: Step
    #: What the story started, undone in reverse when it ends (``frame.cleanup``).
    resources: ExitStack = field(default_factory=ExitStack)
    queue: Any = None
    pending_messages: set[str] = field(default_factory=set)
    hub_version: int = -1  # the hub scanner's commit
    recovery_started: datetime | None = None


def run_demo(
    workspace: str | Path | None,
    *,
    packages: int = 40,
    step: Step,
    bar: Bar,
) -> DemoReport:
    """Play the story in ``workspace`` (a temporary folder, removed afterwards, when None)."""
    from outbox.app.facade import Outbox

    frame = story_workspace(workspace, "outbox-demo-", DemoReport, packages=packages)
    with frame as (ws, report), cleanup() as resources:
        clock = DemoClock()
        ob = Outbox.open(ws, clock=clock)
        resources.callback(ob.close)
        story = _Story(ob, clock, report, step, resources)
        _ordinary_steps(story, bar)
        _hub_scan(story, ws)
        _rescue(story)
        received, sent = _work_and_consume(story)
        _verify(story, received, sent)
    return report


def _ordinary_steps(story: _Story, bar: Bar) -> None:
    """1. The application: two ordinary steps, dispatched right after each commit."""
    ob, report, packages = story.ob, story.report, story.report.packages
    settings = ob.settings
    report.rescue_delay_s = settings.rescue_delay
    story.step(
        f"workspace {report.workspace}: Delta table {settings.table_uri}, SQLite queue "
        f"{settings.sql_url}"
    )
    for s in (0, 1):
        with bar(f"saving '{STATUSES[s]}'", packages) as advance:
            for lo in range(0, packages, SAVE_BATCH):
                advance(_save_status(ob, range(lo, min(packages, lo + SAVE_BATCH)), s))
    report.written = 2 * packages
    story.step(f"saved and dispatched {2 * packages} status updates for {packages} packages")


def _hub_scan(story: _Story, ws: Path) -> None:
    """2. The hub scanner: one commit, then its dispatcher is SIGKILLed mid-batch."""
    ob, report, packages = story.ob, story.report, story.report.packages
    report.killed_at = CRASH
    report.send_batch = send_batch(packages)
    story.step(
        f"hub scanner (a separate process) saves '{STATUSES[2]}' for all {packages} packages "
        f"in one commit and sends them {report.send_batch} at a time; its dispatcher will be "
        "SIGKILLed between the second and the third send batch"
    )
    if ob.runtime.watermarks is not None:  # written now, not in the middle of the hub scan
        ob.runtime.watermarks.flush()
    story.hub_version = ob.store.refresh() + 1  # nothing else writes until the child is done
    report.dispatcher_exit = _run_hub_scanner(story, ws)
    report.written = 3 * packages
    pending = ob.store.scan_pending(columns=["id", "last_seq", "dispatched_seq"]).to_pylist()
    report.pending_after_crash = len(pending)
    report.messages_pending_after_crash = sum(
        int(r["last_seq"]) - int(r["dispatched_seq"]) for r in pending
    )
    if report.dispatcher_exit == -9:
        died = "was SIGKILLed"
    else:
        died = f"was not killed (it exited with {report.dispatcher_exit} before its crash point)"
    story.step(
        f"the hub scanner {died}: {len(pending)} packages still hold "
        f"{report.messages_pending_after_crash} unsent (or unrecorded) messages"
    )
    _, rows = ob.store.read(sorted({str(r["id"]) for r in pending}))
    story.pending_messages = {m.message_id for r in rows.values() for m in r.pending()}


def _run_hub_scanner(story: _Story, ws: Path) -> int:
    """Run the hub scanner's process to its end; its exit code (-9: SIGKILLed). It runs in a
    session of its own (a Ctrl-C at the terminal is the demo's to handle, not the child's), and
    the demo kills it on the way out, whatever made it leave (Ctrl-C, a timeout)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HUB_SCANNER, str(ws), str(story.report.packages), CRASH],
        start_new_session=True,
    )
    story.resources.callback(_kill, proc)
    try:
        return proc.wait(HUB_SCAN_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        story.report.problems.append(
            f"the hub scanner did not reach its crash point within {HUB_SCAN_TIMEOUT:g}s; "
            "the demo killed it"
        )
        return proc.returncode


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _rescue(story: _Story) -> None:
    """3. The rescuer: nothing is old enough yet; after its delay it enqueues commands."""
    from dispatcher.queue.sql_queue import SqlQueue
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import SqlCheckpointStore
    from rescuer.runner import RescuePass
    from rescuer.sink import QueueSink

    ob, clock, report = story.ob, story.clock, story.report
    settings = ob.settings
    story.queue = SqlQueue.from_settings(settings, clock=clock)
    story.resources.callback(story.queue.close)
    checkpoints = SqlCheckpointStore(settings.sql_url)
    story.resources.callback(checkpoints.close)
    rescuer = RescuePass(
        ob.store,
        LocalEngine(storage_options=settings.storage_options),
        checkpoints,
        QueueSink(story.queue, settings.command_queue),
        clock=clock,
        delay=settings.rescue_delay,
    )
    first = rescuer.run()
    report.rescue_passes.append(_pass(first, clock.skipped))
    delay = settings.rescue_delay
    age = _commit_age(story)
    if first.mode == "sweep" or (first.window_end or -1) >= story.hub_version:
        # A first pass sweeps the table as it is now once any commit is past the delay (the
        # saves of thousands of packages take that long): the hub scanner's documents included.
        how = (
            "no checkpoint yet, and commits past the "
            f"{delay:g}s rescue delay exist, so it sweeps the table as it is now"
            if first.mode == "sweep"
            else f"its window reaches the hub scanner's commit (past the {delay:g}s delay)"
        )
        story.step(
            f"rescuer pass 1 (now): {how}, the hub scanner's commit ({age:.1f}s old) included: "
            f"{first.documents_examined} documents examined, {_commands(first)}, checkpoint -> "
            f"version {first.checkpoint_after}; no clock to move"
        )
        return
    if first.mode is None:
        why = f"no commit is {delay:g}s old yet (the hub scanner's is {age:.1f}s old)"
    else:
        why = f"the hub scanner's commit is {age:.1f}s old, under the {delay:g}s rescue delay"
    story.step(
        f"rescuer pass 1 (now): {_commands(first)}; {why}, so it leaves the hub scanner's "
        "documents to their dispatcher (a live one would still be sending)"
    )
    clock.skipped += delay + 1
    report.simulated_s = clock.skipped
    second = rescuer.run()
    report.rescue_passes.append(_pass(second, clock.skipped))
    story.step(
        f"rescuer pass 2 (clock moved {clock.skipped:g}s forward, SIMULATED): "
        f"{second.documents_examined} documents examined, {_commands(second)}, "
        f"checkpoint -> version {second.checkpoint_after}"
    )


def _commit_age(story: _Story) -> float:
    """Seconds since the hub scanner's commit, by the demo's clock."""
    from rescuer.window import commit_times

    store = story.ob.store
    latest = store.refresh()
    commits = commit_times(store.delta_table, latest - story.hub_version + 1, latest=latest)
    at = next(c.timestamp for c in commits if c.version == story.hub_version)
    return (story.clock.now() - at).total_seconds()


def _commands(report: Any) -> str:
    text = f"{report.commands_enqueued} ProcessDocument commands enqueued"
    if report.duplicates_dropped:
        text += f" ({report.duplicates_dropped} already queued, dropped by the queue)"
    return text


def _work_and_consume(story: _Story) -> tuple[list[Any], int]:
    """4. The command worker finishes the job; 5. a consumer drains the queue."""
    from dispatcher.worker import DispatcherWorker

    story.recovery_started = story.clock.now()
    stats = DispatcherWorker(story.ob.runtime, poll_interval=0.05).run(until_idle=True)
    if stats.stopped_by_signal:  # the worker's graceful stop; for the demo, Ctrl-C ends the story
        raise KeyboardInterrupt
    story.step(
        f"worker: {stats.commands} commands, {stats.messages_sent} messages sent, "
        f"{stats.completed} completed, {stats.dead_lettered} dead-lettered"
    )
    return _drain(story.queue, story.step), stats.messages_sent


def _verify(story: _Story, received: list[Any], worker_sent: int) -> None:
    """Each package's statuses once and in order; every invariant from the table and the log."""
    from outbox.app.checker.truth import read_truth

    report, ob = story.report, story.ob
    report.received = len(received)
    seen: dict[str, Any] = {}
    steps_by_package: dict[str, list[int]] = {}
    for msg in received:
        if msg.message_id in seen:
            report.duplicates += 1
            continue
        seen[msg.message_id] = msg
        body = json.loads(msg.body)
        steps_by_package.setdefault(str(body["package"]), []).append(int(body["step"]))
    report.delivered = len(seen)
    started = story.recovery_started
    after = sum(1 for m in seen.values() if started is not None and m.enqueued_at >= started)
    report.resends_dropped_by_queue = max(0, worker_sent - after)
    report.packages_in_order = sum(
        1 for s in steps_by_package.values() if s == list(range(1, len(STATUSES) + 1))
    )
    truth = read_truth(ob.store.delta_table)
    rescued = [seen[m] for m in story.pending_messages if m in seen]
    report.rescued = sum(1 for m in rescued if started is not None and m.enqueued_at >= started)
    latencies = [
        m.enqueued_at.timestamp() - truth.committed_at[m.message_id]
        for m in rescued
        if m.message_id in truth.committed_at
    ]
    report.max_rescue_latency_s = round(max(latencies, default=0.0), 2)
    _invariants(story, received, truth)


def _invariants(story: _Story, received: list[Any], truth: Any) -> None:
    from dispatcher.invariants import verify_deliveries
    from dispatcher.transports.base import TransportMessage

    report, settings, packages = story.report, story.ob.settings, story.report.packages
    inv = verify_deliveries(
        truth.committed,
        [
            TransportMessage(m.message_id, DESTINATION, m.body, session_id=m.session_id)
            for m in received
        ],
    )
    _, final = story.ob.store.read([package_id(i) for i in range(packages)])
    undispatched = [i for i, r in final.items() if r.dispatched_seq < r.last_seq]
    bound = settings.rescue_delay + settings.rescue_interval + settings.lock_duration
    report.invariants = {
        "I1 no loss": not inv.lost and not undispatched and report.delivered == 3 * packages,
        "I2 order": not inv.out_of_order and report.packages_in_order == packages,
        "I3 no phantom": not inv.phantoms,
        "I4 no interference": not truth.watermark_regressions,
        "I5 bounded rescue": report.max_rescue_latency_s <= bound,
        "I6 idempotence": not inv.mismatched and not truth.changed_content,
    }
    if not report.rescued:  # its latency bound held over no message at all
        report.not_exercised["I5 bounded rescue"] = "the crash left no message unsent to rescue"
    for name, items in (
        ("lost", inv.lost),
        ("out of order", inv.out_of_order),
        ("phantoms", inv.phantoms),
        ("not dispatched", undispatched),
    ):
        if items:
            report.problems.append(f"{name}: {len(items)} e.g. {items[:3]}")


def _pass(report: Any, simulated: float) -> dict[str, Any]:
    return {
        "mode": report.mode or "idle",
        "commands_enqueued": report.commands_enqueued,
        "documents_examined": report.documents_examined,
        "checkpoint_after": report.checkpoint_after,
        "simulated_seconds": simulated,
    }


def _drain(queue: Any, step: Step) -> list[Any]:
    out: list[Any] = []
    for _ in range(10_000):
        batch = queue.receive(DESTINATION, 100)
        if not batch:
            break
        for msg in batch:
            out.append(msg)
            queue.complete(msg)
    step(f"consumer: received {len(out)} messages from queue {DESTINATION!r}")
    return out


def iter_rows(report: DemoReport) -> Iterator[tuple[str, str]]:
    """The summary table's rows."""
    yield "packages", str(report.packages)
    yield "status updates written", str(report.written)
    yield "delivered (distinct)", str(report.delivered)
    yield "duplicates seen by the consumer", str(report.duplicates)
    yield "re-sends dropped by the queue", f"{report.resends_dropped_by_queue} (same message id)"
    if report.dispatcher_exit == -9:
        killed = f"{report.killed_at} (exit -9; {report.send_batch} messages per send batch)"
    else:
        killed = f"not killed: exited with {report.dispatcher_exit} before {report.killed_at}"
    yield "dispatcher killed at", killed
    yield (
        "left pending by the kill",
        f"{report.messages_pending_after_crash} messages in {report.pending_after_crash} packages",
    )
    yield "rescued by the worker", str(report.rescued)
    if not report.rescued:
        latency = "- (nothing rescued)"
    elif report.simulated_s:
        latency = (
            f"{report.max_rescue_latency_s:.1f}s ({report.simulated_s:g}s of it simulated; "
            f"rescue delay {report.rescue_delay_s:g}s)"
        )
    else:
        latency = f"{report.max_rescue_latency_s:.1f}s (none simulated; rescue delay "
        latency += f"{report.rescue_delay_s:g}s)"
    yield "max rescue latency", latency
    yield "packages with statuses in order", f"{report.packages_in_order}/{report.packages}"
    yield from closing_rows(report, report.not_exercised)

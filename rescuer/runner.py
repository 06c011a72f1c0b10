"""One rescue pass (docs/design.md, "The flows"), independent of the engine that reads the table.

1. Read the checkpoint v0 (a version). 2. Find v1, the newest version at least ``delay`` old.
3. Plan from the change feed over (v0, v1] (or a full sweep: no checkpoint yet, ``full=True``, or
the feed is gone). 4. Enqueue a ``ProcessDocument`` per pending document, its id derived from
(table, id, last_seq). 5. Only then compare-and-set the checkpoint to v1.

Why this order is safe: a crash (or Ctrl-C) anywhere before step 5 leaves the checkpoint where it
was, so the next pass re-plans the same window and the queue drops the repeated command ids.
A crash after step 5 loses nothing, because every command of the window is already durable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.commands import ProcessDocument, commands_for
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.durations import format_duration
from outbox.core.errors import (
    CheckpointConflictError,
    CheckpointError,
    FeedUnavailableError,
    OutboxError,
    ValidationError,
)
from outbox.core.observers import Observer
from outbox.core.settings import MAX_RESCUE_DELAY, MIN_RESCUE_DELAY
from outbox.core.tracing import TRACING
from outbox.delta.store import DeltaDocumentStore
from rescuer.checkpoint import Checkpoint, CheckpointStore
from rescuer.journal import Journal, RescueEntry
from rescuer.planner import Engine, FeedWindow, Mode, Plan, driver_errors
from rescuer.sink import CommandSink
from rescuer.window import WindowEnd, find_window_end, lag_seconds

log = logging.getLogger("outbox.rescuer")

CAS_ATTEMPTS = 5
#: Pending ids listed in a report (the count is always exact).
REPORT_IDS = 20


@dataclass
class PassReport:
    """One pass: ``to_dict()`` is the ``--json`` output and what ``outbox status`` shows."""

    table_uri: str
    rescuer_name: str
    engine: str
    mode: Mode | None  # None: nothing was old enough to plan
    started_at: datetime
    duration_s: float
    delay_s: float
    latest_version: int
    checkpoint_before: int | None
    checkpoint_after: int | None
    window_start: int | None  # exclusive
    window_end: int | None  # inclusive (v1)
    versions_scanned: int
    change_rows: int
    documents_examined: int
    pending_documents: int
    commands_enqueued: int
    duplicates_dropped: int
    lag_versions: int
    lag_seconds: float
    warnings: list[str] = field(default_factory=list)
    pending_ids: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report. A pass with nothing old enough to plan is ``"mode": "idle"``,
        as the text says ``mode=idle`` (``mode`` stays None on the object)."""
        d = asdict(self)
        d["started_at"] = self.started_at.isoformat()
        d["mode"] = self.mode or "idle"
        return d

    def summary(self) -> str:
        """One pass on one line, for a log or a pipe (the pass's INFO line, ``outbox rescue``
        piped, the Spark job): what it read, what it enqueued and what the queue already held
        (``already_queued``: commands the queue dropped as duplicates)."""

        def v(value: int | None) -> str:
            return "-" if value is None else str(value)

        return (
            f"rescue {self.table_uri} [{self.rescuer_name}/{self.engine}] "
            f"mode={self.mode or 'idle'} window=({v(self.window_start)},"
            f"{v(self.window_end)}] versions={self.versions_scanned} "
            f"pending_docs={self.pending_documents} enqueued={self.commands_enqueued} "
            f"already_queued={self.duplicates_dropped} "
            f"checkpoint={v(self.checkpoint_before)}->{v(self.checkpoint_after)} "
            f"lag={self.lag_versions}v/{format_duration(self.lag_seconds)}"
        )


def check_delay(delay: float) -> float:
    """The rescue delay must be 15 s..1 h: shorter races the immediate dispatcher, longer risks
    outliving the feed's retention."""
    if not MIN_RESCUE_DELAY <= delay <= MAX_RESCUE_DELAY:
        raise ValidationError(
            f"rescue delay {delay:g}s is outside 15s..1h",
            hint="pass --delay between 15s and 1h (for example --delay 30s)",
        )
    return delay


class RescuePass:
    """Runs passes of one rescuer (``name``) over one table. Reusable across passes."""

    def __init__(
        self,
        store: DeltaDocumentStore,
        engine: Engine,
        checkpoints: CheckpointStore,
        sink: CommandSink,
        *,
        clock: Clock | None = None,
        delay: float = MIN_RESCUE_DELAY,
        name: str = "default",
        observer: Observer = TRACING,
    ) -> None:
        """``observer`` watches each pass (default: its span and the rescue gauges)."""
        self.store = store
        self.engine = engine
        self.checkpoints = checkpoints
        self.sink = sink
        self.clock = clock or SystemClock()
        self.delay = check_delay(delay)
        self.name = name
        self.observe = observer
        #: records the commands each pass enqueues (``rescuer.journal``); None: not recorded
        self.journal: Journal | None = None
        #: version -> commit time, kept across passes (commits never change), so each pass
        #: reads only the commits made since the previous one (see ``find_window_end``).
        self._commit_times: dict[int, datetime] = {}
        self._commit_times_of: str | None = None  # the table id they belong to

    @property
    def table_uri(self) -> str:
        return self.store.uri

    def checkpoint(self) -> Checkpoint | None:
        """The stored checkpoint (validated against this table)."""
        cp = self.checkpoints.read(self.table_uri, self.name)
        if cp is not None and cp.table_id is not None and cp.table_id != self.store.table_id:
            raise CheckpointError(
                f"the rescuer checkpoint {self.name!r} for {self.table_uri} belongs to table id "
                f"{cp.table_id}, but the table there is {self.store.table_id} (was it recreated?)",
                hint="run `outbox rescue --full` to sweep the new table and replace the checkpoint",
            )
        return cp

    def run(self, *, full: bool = False) -> PassReport:
        """One pass, watched by the observer (traced as ``outbox.rescue``, so its commands carry
        this trace, and measured)."""
        with self.observe.rescuing(self.name):
            report = self._run(full=full)
            self.observe.rescued(report)
        return report

    def _run(self, *, full: bool = False) -> PassReport:
        t0 = time.perf_counter()
        started = utc(self.clock.now())
        warnings: list[str] = []
        cp = self._read_checkpoint(full, warnings)
        before = cp.version if cp is not None else None
        with driver_errors(f"refreshing the table at {self.table_uri}"):
            latest = self.store.refresh()
        if before is not None and before > latest:
            if not full:
                raise CheckpointError(
                    f"the rescuer checkpoint {self.name!r} is at version {before}, but the table "
                    f"at {self.table_uri} only reaches version {latest} (was it recreated?)",
                    hint="run `outbox rescue --full` to sweep the table and replace the checkpoint",
                )
            warnings.append(f"checkpoint {before} is past the table's version {latest}; replaced")
            before = None
        sweep = full or before is None
        now = utc(self.clock.now())
        if self._commit_times_of != self.store.table_id:  # a recreated table: others' commits
            self._commit_times.clear()
            self._commit_times_of = self.store.table_id
        end = find_window_end(
            self.store.delta_table,
            now=now,
            delay=self.delay,
            floor=None if sweep else before,
            known=self._commit_times,
        )
        plan: Plan | None = None
        if end.end is not None:
            if not sweep:
                assert before is not None
                window = FeedWindow(before, end.end, latest)
                try:
                    plan = self.engine.plan_feed(self.table_uri, window)
                except FeedUnavailableError as e:
                    msg = f"FEED UNAVAILABLE, falling back to a full sweep: {e}"
                    log.warning(msg)
                    warnings.append(msg)
                    sweep = True
            if sweep:
                plan = self.engine.plan_sweep(self.table_uri, latest)
        enqueued = 0
        pending = plan.pending if plan is not None else ()
        if pending:
            commands = commands_for(self.store.table_id, self.table_uri, [p.ref() for p in pending])
            enqueued = self.sink.enqueue(commands)
            mode = plan.mode if plan is not None else "sweep"
            self._record(commands, mode, end.end, now, warnings)
        after = self._advance(cp, end, plan, started, warnings, full=full)
        timings = dict(plan.timings) if plan is not None else {}
        timings["total_s"] = time.perf_counter() - t0
        report = PassReport(
            table_uri=self.table_uri,
            rescuer_name=self.name,
            engine=self.engine.name,
            mode=plan.mode if plan is not None else None,
            started_at=started,
            duration_s=timings["total_s"],
            delay_s=self.delay,
            latest_version=latest,
            checkpoint_before=cp.version if cp is not None else None,
            checkpoint_after=after,
            window_start=before if plan is not None and plan.mode == "feed" else None,
            window_end=end.end,
            versions_scanned=_scanned(plan, before, end),
            change_rows=plan.change_rows if plan is not None else 0,
            documents_examined=plan.documents if plan is not None else 0,
            pending_documents=len(pending),
            commands_enqueued=enqueued,
            duplicates_dropped=len(pending) - enqueued,
            lag_versions=latest - (after if after is not None else -1),
            lag_seconds=lag_seconds(
                self.store.delta_table, after, latest, now, known=self._commit_times
            ),
            warnings=warnings,
            pending_ids=[p.id for p in pending[:REPORT_IDS]],
            timings=timings,
        )
        log.info(report.summary())
        return report

    def _record(
        self,
        commands: Sequence[ProcessDocument],
        mode: str,
        window_end: int | None,
        now: datetime,
        warnings: list[str],
    ) -> None:
        """The journal's rows of this pass's commands; a failure is a warning, not the pass's:
        the commands are already enqueued."""
        if self.journal is None:
            return
        entries = [
            RescueEntry(c.table, c.id, c.up_to_seq, c.command_id, self.name, self.engine.name,
                        mode, window_end, now)
            for c in commands
        ]  # fmt: skip
        try:
            self.journal.record(entries)
        except OutboxError as e:
            msg = f"the rescuer's journal was not written (the commands were sent): {e}"
            log.warning(msg)
            warnings.append(msg)

    def _read_checkpoint(self, full: bool, warnings: list[str]) -> Checkpoint | None:
        try:
            return self.checkpoint()
        except CheckpointError as e:
            if not full or isinstance(e, CheckpointConflictError):
                raise
            # --full is the documented repair: it sweeps and overwrites whatever is stored.
            warnings.append(f"ignoring an unusable checkpoint: {e}")
            return _raw_generation(self.checkpoints, self.table_uri, self.name)

    def _advance(
        self,
        cp: Checkpoint | None,
        end: WindowEnd,
        plan: Plan | None,
        at: datetime,
        warnings: list[str],
        *,
        full: bool,
    ) -> int | None:
        """Compare-and-set the checkpoint to v1, never backwards, never over a newer one."""
        target = end.end
        current = cp
        for _ in range(CAS_ATTEMPTS):
            have = current.version if current is not None else None
            if target is None or (have is not None and have >= target and not full):
                new = have  # nothing new is covered; still record that a pass ran
            else:
                new = target
            details = {
                "table_id": self.store.table_id,
                "engine": self.engine.name,
                "mode": plan.mode if plan is not None else None,
                "pending": len(plan.pending) if plan is not None else 0,
                "latest_version": end.latest,
                "warnings": len(warnings),
            }
            try:
                written = self.checkpoints.write(
                    self.table_uri,
                    self.name,
                    expected_generation=current.generation if current is not None else None,
                    version=new,
                    at=at,
                    details=details,
                )
                return written.version
            except CheckpointConflictError:
                current = self.checkpoints.read(self.table_uri, self.name)
                theirs = current.version if current is not None else None
                if theirs is not None and (target is None or theirs >= target):
                    msg = (
                        f"another rescuer named {self.name!r} advanced the checkpoint to "
                        f"{theirs} during this pass; keeping theirs"
                    )
                    log.warning(msg)
                    warnings.append(msg)
                    return theirs
                # They are behind our window: our pass covered theirs too, so retry on top.
        raise CheckpointConflictError(
            f"the rescuer checkpoint {self.name!r} for {self.table_uri} kept moving under "
            f"{CAS_ATTEMPTS} compare-and-set attempts; the commands are enqueued, the "
            "checkpoint was not advanced",
            hint="run one rescuer per table and name; the next pass will advance it",
        )


def _raw_generation(store: CheckpointStore, uri: str, name: str) -> Checkpoint | None:
    """A stand-in for an unreadable row that keeps only its generation, for the CAS."""
    generation = store.generation(uri, name)
    if generation is None:
        return None
    return Checkpoint(uri, name, None, generation, None, datetime.fromtimestamp(0, tz=UTC), {})


def _scanned(plan: Plan | None, before: int | None, end: WindowEnd) -> int:
    if plan is None or end.end is None:
        return 0
    if plan.mode == "feed" and before is not None:
        return end.end - before
    return end.end + 1  # a sweep covers every version up to v1


def run_pass(
    store: DeltaDocumentStore,
    engine: Engine,
    checkpoints: CheckpointStore,
    sink: CommandSink,
    *,
    clock: Clock | None = None,
    delay: float = MIN_RESCUE_DELAY,
    name: str = "default",
    full: bool = False,
) -> PassReport:
    """One pass; see ``RescuePass``."""
    return RescuePass(store, engine, checkpoints, sink, clock=clock, delay=delay, name=name).run(
        full=full
    )

"""The rescuer-engine contract: whole rescue passes (docs/design.md, "The flows") over real Delta
tables, so an engine is judged by what the pass enqueues and where it leaves the checkpoint.

Why it ships: ``RescuePass`` trusts its engine to plan exactly the documents whose latest image in
the window (v0, v1] is still pending *now*, to sweep when asked, and to report a vacuumed feed as
``FeedUnavailableError``. Our local (delta-rs) and Spark engines run this same class; another
engine (DuckDB, Polars, a warehouse) subclasses ``RescuerEngineContract`` and implements
``make_engine``. Tables are written by delta-rs (``outbox.testing.tables.Table``) and time is a
``ManualClock`` set relative to the real commit timestamps.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from outbox.core.clock import ManualClock
from outbox.core.errors import CheckpointError
from outbox.testing.faulty import FaultySink
from outbox.testing.tables import Table
from rescuer.checkpoint import InMemoryCheckpointStore
from rescuer.planner import Engine
from rescuer.runner import RescuePass
from rescuer.sink import InMemorySink

#: The rescue delay every contract pass uses (the minimum the runner accepts).
DELAY = 15.0


def _baseline(table: Table, rescuer: RescuePass, clock: ManualClock) -> int:
    """A first pass (a sweep) that leaves the checkpoint at the current version."""
    v = table.put(("base", 1))
    table.dispatch(base=1)
    v = table.store.refresh()
    clock.set(table.at(v, DELAY + 1))
    report = rescuer.run()
    assert report.mode == "sweep"
    assert report.checkpoint_after == v
    return v


def _ids(sink: InMemorySink) -> list[tuple[str, int]]:
    return [(c.id, c.up_to_seq) for c in sink.commands]


class RescuerEngineContract:
    """Subclass as ``Test<YourEngine>``; override ``make_engine``."""

    #: a feed window over vacuumed history raises ``FeedUnavailableError`` (the pass then sweeps)
    supports_vacuumed_history_detection = True

    def make_engine(self) -> Engine:
        """The engine under test (called once per test, after the subclass's autouse fixtures)."""
        raise NotImplementedError

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def table(self, tmp_path: Path) -> Table:
        return Table(tmp_path / "documents")

    @pytest.fixture
    def checkpoints(self) -> InMemoryCheckpointStore:
        return InMemoryCheckpointStore()

    @pytest.fixture
    def sink(self) -> FaultySink:
        return FaultySink()

    @pytest.fixture
    def engine(self) -> Engine:
        return self.make_engine()

    @pytest.fixture
    def rescuer(
        self,
        table: Table,
        engine: Engine,
        checkpoints: InMemoryCheckpointStore,
        sink: InMemorySink,
        clock: ManualClock,
    ) -> RescuePass:
        return RescuePass(table.store, engine, checkpoints, sink, clock=clock, delay=DELAY)

    def test_first_pass_sweeps_then_follows_the_feed(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        v1 = table.put(("a", 1), ("b", 2))
        clock.set(table.at(v1, DELAY + 1))
        first = rescuer.run()
        assert first.mode == "sweep"
        assert first.checkpoint_before is None
        assert first.checkpoint_after == v1
        assert sorted(_ids(sink)) == [("a", 1), ("b", 2)]
        v2 = table.put(("c", 1))
        clock.set(table.at(v2, DELAY + 1))
        second = rescuer.run()
        assert second.mode == "feed"
        assert (second.window_start, second.window_end) == (v1, v2)
        assert second.versions_scanned == 1
        assert second.commands_enqueued == 1
        assert _ids(sink)[-1] == ("c", 1)
        assert second.lag_versions == 0
        assert second.lag_seconds == 0

    def test_change_younger_than_the_delay_is_not_rescued_until_it_is_older(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        base = _baseline(table, rescuer, clock)
        v = table.put(("young", 1))
        clock.set(table.at(v, DELAY - 1))
        early = rescuer.run()
        assert early.commands_enqueued == 0
        assert early.checkpoint_after == base
        assert early.lag_versions == 1
        assert 0 < early.lag_seconds <= DELAY
        clock.set(table.at(v, DELAY))
        late = rescuer.run()
        assert late.mode == "feed"
        assert _ids(sink) == [("young", 1)]
        assert late.checkpoint_after == v

    # --- the versions layout (outbox.delta.versions) ----------------------------------------

    def test_a_document_saved_twice_plans_as_its_newest_version(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """Two saves append two rows of one document: it is one pending document, at the newest
        version's ``last_seq``."""
        base = _baseline(table, rescuer, clock)
        table.put(("a", 1))
        v = table.put(("a", 3))
        clock.set(table.at(v, DELAY + 1))
        report = rescuer.run()
        assert report.mode == "feed"
        assert report.checkpoint_before == base
        assert _ids(sink) == [("a", 3)]

    def test_a_mark_row_counts_for_the_document(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """The dispatcher's mark (a mark row) landed after a save had appended version 2 carrying
        the watermark it had read (0): the document's watermark is the highest of its rows', so
        it is not pending."""
        _baseline(table, rescuer, clock)
        table.put(("a", 1))
        table.put(("a", 1))
        v = table.dispatch(a=1)
        clock.set(table.at(v, DELAY + 1))
        assert rescuer.run().commands_enqueued == 0
        assert _ids(sink) == []

    def test_a_later_mark_row_hides_no_newer_message(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """Version 2 (seq 2 pending) was saved, then the dispatcher's mark for seq 1 landed: the
        newest change is the mark row, but the document is version 2, still pending."""
        _baseline(table, rescuer, clock)
        table.put(("a", 1))
        table.put(("a", 2))
        v = table.dispatch(a=1)
        clock.set(table.at(v, DELAY + 1))
        rescuer.run()
        assert _ids(sink) == [("a", 2)]

    def test_a_late_mark_of_a_deleted_life_hides_no_document(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """A document deleted and created again (a new life, pending), then the dispatcher's
        mark for the old life lands: the newest change names the old life, but the document is
        the new life's, still pending."""
        _baseline(table, rescuer, clock)
        table.put(("a", 1), life="1" * 32)
        table.delete("a")
        table.put(("a", 1), life="2" * 32)
        v = table.mark("a", 1, "1" * 32)
        clock.set(table.at(v, DELAY + 1))
        report = rescuer.run()
        assert report.mode == "feed"
        assert _ids(sink) == [("a", 1)]

    def test_a_fold_hides_no_pending_document(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """The fold deletes superseded versions (change rows of type ``delete``): in the same
        window as the newest version it changes nothing, and alone in a window it is no change
        of any document."""
        _baseline(table, rescuer, clock)
        table.put(("a", 1), ("b", 1))
        table.put(("a", 2))
        table.dispatch(b=1)
        v = table.fold()
        clock.set(table.at(v, DELAY + 1))
        assert _ids(sink) == []
        rescuer.run()
        assert _ids(sink) == [("a", 2)]
        table.put(("c", 1), ("d", 1))
        table.put(("c", 2))
        w = table.fold()
        clock.set(table.at(w, DELAY + 1))
        rescuer.run()  # the window holds both saves of c and its fold: c at its newest version
        assert sorted(_ids(sink)[1:]) == [("c", 2), ("d", 1)]
        x = table.fold()  # nothing left to fold: a window of no document change
        clock.set(table.at(x, DELAY + 1))
        assert rescuer.run().commands_enqueued == 0

    def test_the_window_ends_at_the_newest_version_old_enough(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """The feed is planned over (checkpoint, v1], v1 the newest version at least the delay
        old, not up to the newest version: a young change beside an old one waits until it has
        aged (enqueued young, it would race the immediate dispatcher)."""
        base = _baseline(table, rescuer, clock)
        old = table.put(("old", 1))
        while datetime.now(UTC) <= table.at(old, 0.002):  # commit times are milliseconds
            time.sleep(0.001)
        young = table.put(("young", 1))
        assert table.committed_at(young) > table.at(old, 0.001)
        clock.set(table.at(old, DELAY + 0.001))  # just past the old change's time plus the delay
        report = rescuer.run()
        assert report.mode == "feed"
        assert (report.window_start, report.window_end) == (base, old)
        assert report.latest_version == young
        assert _ids(sink) == [("old", 1)], f"a change younger than the delay: {_ids(sink)}"
        assert report.checkpoint_after == old
        clock.set(table.at(young, DELAY + 0.001))
        aged = rescuer.run()
        assert (aged.window_start, aged.window_end) == (old, young)
        assert _ids(sink) == [("old", 1), ("young", 1)]
        assert aged.checkpoint_after == young

    def test_only_the_latest_post_image_counts(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        _baseline(table, rescuer, clock)
        table.put(("sent", 1), ("twice", 1), ("gone", 1))
        table.dispatch(sent=1)  # dispatched inside the window: its latest image is not pending
        table.put(("twice", 3))
        v = table.delete("gone")
        clock.set(table.at(v, DELAY + 1))
        report = rescuer.run()
        assert report.mode == "feed"
        assert _ids(sink) == [("twice", 3)]
        assert report.documents_examined == 3
        assert report.versions_scanned == 4

    def test_a_bucket_rewritten_in_one_commit_keeps_its_pending_documents(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        """A repair replaces a bucket: its commit deletes and inserts every row. That rewrites
        the documents; it ends none of them."""
        _baseline(table, rescuer, clock)
        table.put(("p", 2), ("q", 1))
        table.dispatch(q=1)
        v = table.rewrite_buckets()
        clock.set(table.at(v, DELAY + 1))
        rescuer.run()
        assert _ids(sink) == [("p", 2)]

    def test_a_document_dispatched_in_a_later_version_is_not_rescued(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        _baseline(table, rescuer, clock)
        v = table.put(("done", 1), ("more", 1))
        table.dispatch(done=1)  # younger than the delay: after the window, but current
        table.put(("more", 2))  # still pending, with a newer message: enqueued at its current seq
        clock.set(table.at(v, DELAY + 0.0005))
        report = rescuer.run()
        assert report.window_end == v
        assert report.change_rows > 0
        assert _ids(sink) == [("more", 2)]
        # The re-check through the feed tail equals a read of the current rows.
        _, rows = table.store.read(["done", "more"])
        assert not rows["done"].has_pending
        assert rows["more"].last_seq == 2

    def test_crash_after_enqueue_before_checkpoint_enqueues_nothing_new(
        self,
        *,
        table: Table,
        engine: Engine,
        checkpoints: InMemoryCheckpointStore,
        sink: InMemorySink,
        clock: ManualClock,
        rescuer: RescuePass,
    ) -> None:
        base = _baseline(table, rescuer, clock)
        v = table.put(("x", 1), ("y", 1))
        clock.set(table.at(v, DELAY + 1))

        class Crash(InMemoryCheckpointStore):
            def write(self, *args: Any, **kwargs: Any) -> Any:
                raise KeyboardInterrupt  # the process dies between the enqueue and the checkpoint

        crashing = Crash()
        crashing._rows = checkpoints._rows
        with pytest.raises(KeyboardInterrupt):
            RescuePass(table.store, engine, crashing, sink, clock=clock, delay=DELAY).run()
        assert len(sink.commands) == 2
        assert checkpoints.read(table.uri, "default").version == base  # type: ignore[union-attr]
        again = rescuer.run()
        assert again.pending_documents == 2
        assert again.commands_enqueued == 0
        assert again.duplicates_dropped == 2
        assert again.checkpoint_after == v
        assert len(sink.commands) == 2

    def test_a_failed_enqueue_leaves_the_checkpoint(
        self, table: Table, rescuer: RescuePass, sink: FaultySink, clock: ManualClock
    ) -> None:
        base = _baseline(table, rescuer, clock)
        v = table.put(("x", 1))
        clock.set(table.at(v, DELAY + 1))
        sink.fail_next = RuntimeError("queue down")
        with pytest.raises(RuntimeError):
            rescuer.run()
        assert rescuer.checkpoint().version == base  # type: ignore[union-attr]
        assert rescuer.run().commands_enqueued == 1

    def test_vacuumed_history_falls_back_to_a_full_sweep(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        if not self.supports_vacuumed_history_detection:
            pytest.skip("the engine does not claim supports_vacuumed_history_detection")
        base = _baseline(table, rescuer, clock)
        table.put(("p", 1), ("q", 1))
        table.put(("p", 2))
        table.dispatch(q=1)
        table.fold()  # rewrites the files the saves added: the vacuum below deletes them
        table.store.delta_table.vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
        )
        v = table.store.refresh()  # vacuum commits too (VACUUM START/END)
        clock.set(table.at(v, DELAY + 1))
        report = rescuer.run()
        assert report.checkpoint_before == base
        assert report.mode == "sweep"
        assert any("FEED UNAVAILABLE" in w for w in report.warnings)
        assert _ids(sink) == [("p", 2)]
        assert report.checkpoint_after == v
        # The next pass follows the feed again from there.
        v2 = table.put(("r", 1))
        clock.set(table.at(v2, DELAY + 1))
        nxt = rescuer.run()
        assert nxt.mode == "feed"
        assert _ids(sink)[-1] == ("r", 1)

    def test_full_forces_a_sweep_and_repeats_enqueue_nothing_new(
        self, table: Table, rescuer: RescuePass, sink: InMemorySink, clock: ManualClock
    ) -> None:
        _baseline(table, rescuer, clock)
        v = table.put(("s", 1))
        clock.set(table.at(v, DELAY + 1))
        assert rescuer.run().commands_enqueued == 1
        forced = rescuer.run(full=True)
        assert forced.mode == "sweep"
        assert forced.pending_documents == 1
        assert forced.commands_enqueued == 0

    def test_foreign_checkpoint_is_a_clear_error_and_full_repairs_it(
        self,
        table: Table,
        rescuer: RescuePass,
        checkpoints: InMemoryCheckpointStore,
        clock: ManualClock,
    ) -> None:
        _baseline(table, rescuer, clock)
        checkpoints.corrupt(table.uri, "default", version=10_000)
        with pytest.raises(CheckpointError, match="only reaches version"):
            rescuer.run()
        checkpoints.corrupt(table.uri, "default", details={"table_id": "someone-else"})
        with pytest.raises(CheckpointError, match="belongs to table id"):
            rescuer.run()
        repaired = rescuer.run(full=True)
        assert repaired.mode == "sweep"
        assert repaired.checkpoint_after == table.store.version()
        assert rescuer.checkpoint() is not None

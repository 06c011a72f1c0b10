"""Log trimming: the Delta log stays short, and never loses what the rescuer still has to read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrations.runner import migrate
from outbox.app.cli import main as cli_main
from outbox.app.facade import Outbox
from outbox.app.maintenance import AutoLogTrimmer, trim_log_safely
from outbox.core.clock import ManualClock
from outbox.core.errors import ConfigurationError, StoreError
from outbox.core.settings import Settings
from outbox.delta.log import LogFile, change_files, list_log, plan_trim, trim_log
from outbox.delta.store import DeltaDocumentStore
from rescuer.cdf_local import LocalEngine
from rescuer.checkpoint import SqlCheckpointStore
from rescuer.runner import run_pass
from rescuer.sink import InMemorySink
from tests.write_path.conftest import bare_outbox

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _files(commits: int, checkpoints: list[int], old_until: int) -> list[LogFile]:
    """A synthetic log: commits 0..commits-1, the first ``old_until`` past the retention."""
    out = [
        LogFile(f"_delta_log/{v:020d}.json", v, T0 + timedelta(seconds=v), True, False)
        for v in range(commits)
    ]
    out += [
        LogFile(f"_delta_log/{v:020d}.checkpoint.parquet", v, T0, False, True) for v in checkpoints
    ]
    return out


def _cutoff(old_until: int) -> datetime:
    return T0 + timedelta(seconds=old_until - 1)


def test_plan_keeps_the_newest_two_checkpoints_when_nothing_else_holds() -> None:
    plan = plan_trim(_files(350, [100, 200, 300], 350), cutoff=_cutoff(350), needed=None)
    assert (plan.keep_from, plan.held_by) == (200, "checkpoints")
    assert {f.version for f in plan.doomed} == set(range(200)) | {100}
    assert all(f.version < 200 for f in plan.doomed)


def test_plan_never_deletes_commits_younger_than_the_retention() -> None:
    plan = plan_trim(_files(350, [100, 200, 300], 150), cutoff=_cutoff(150), needed=None)
    assert (plan.keep_from, plan.held_by) == (100, "retention")
    assert max(f.version for f in plan.doomed) == 99


def test_plan_never_passes_the_oldest_version_a_rescuer_needs() -> None:
    plan = plan_trim(_files(350, [100, 200, 300], 350), cutoff=_cutoff(350), needed=150)
    assert (plan.keep_from, plan.held_by) == (100, "rescuer")
    plan = plan_trim(_files(350, [100, 200, 300], 350), cutoff=_cutoff(350), needed=50)
    assert plan.keep_from is None
    assert plan.doomed == ()


def test_plan_needs_two_checkpoints() -> None:
    plan = plan_trim(_files(150, [100], 150), cutoff=_cutoff(150), needed=None)
    assert plan.keep_from is None
    assert plan.doomed == ()


def _write(ob: Outbox, n: int, prefix: str) -> int:
    version = 0
    for i in range(n):
        with ob.unit_of_work() as uow:
            uow.create(f"{prefix}{i}", type="T").send("E", {"i": i}, destination="q")
        version = ob.store.version()
    return version


def _checkpoint(ob: Outbox) -> int:
    ob.store.refresh()
    ob.store.delta_table.create_checkpoint()
    return ob.store.version()


def _write_and_checkpoint(ob: Outbox, prefixes: str, n: int = 3) -> None:
    """For each prefix: ``n`` commits, then a Delta checkpoint."""
    for prefix in prefixes:
        _write(ob, n, prefix)
        _checkpoint(ob)


def _later() -> ManualClock:
    """A clock two hours ahead: every commit file on disk is past a one-hour retention."""
    return ManualClock(datetime.now(UTC) + timedelta(hours=2))


def test_trimmed_table_opens_reads_writes_and_keeps_its_feed(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    _write(ob, 6, "a")
    c1 = _checkpoint(ob)
    _write(ob, 6, "b")
    c2 = _checkpoint(ob)
    _write(ob, 3, "c")
    before = {f.version for f in list_log(ob.store.uri)}
    report = trim_log(ob.store.uri, now=_later().now(), retention=timedelta(hours=1), needed=None)
    assert (report.keep_from, report.held_by) == (c1, "checkpoints")
    after = {f.version for f in list_log(ob.store.uri)}
    assert min(after) == c1
    assert report.deleted > 0
    assert before - after == set(range(c1))
    assert c2 in after

    fresh = DeltaDocumentStore(ob.store.uri)  # a new process opening the trimmed table
    _, rows = fresh.read([f"a{i}" for i in range(6)] + ["c2"])
    assert len(rows) == 7
    import pyarrow as pa

    feed = pa.RecordBatchReader.from_stream(
        fresh.delta_table.load_cdf(starting_version=c1 + 1)
    ).read_all()
    assert feed.num_rows == 9  # the b and c inserts are all still in the feed
    _write(ob, 1, "d")  # and the writer goes on
    assert DeltaDocumentStore(ob.store.uri).read(["d0"])[1]


def test_dry_run_deletes_nothing(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    _write_and_checkpoint(ob, "abc")
    before = list_log(ob.store.uri)
    report = trim_log(
        ob.store.uri, now=_later().now(), retention=timedelta(hours=1), needed=None, dry_run=True
    )
    assert report.deleted > 0
    assert report.dry_run
    assert list_log(ob.store.uri) == before


def test_trim_stops_at_the_rescuer_checkpoint_and_the_next_pass_reads_the_feed(
    workspace: Path,
) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write(ob, 4, "a")
    c0 = _checkpoint(ob)
    checkpoints = SqlCheckpointStore(settings.sql_url)
    sink = InMemorySink()
    clock = _later()
    first = run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=clock)
    assert first.mode == "sweep"
    assert first.checkpoint_after is not None
    rescued_at = first.checkpoint_after
    # more pending documents and checkpoints after the rescuer's position
    _write_and_checkpoint(ob, "bcd", 4)

    report = trim_log_safely(
        ob.store, clock=clock, sql_url=settings.sql_url, retention_seconds=3600
    )
    assert report["held_by"] == "rescuer"
    assert rescued_at >= c0
    assert report["keep_from_version"] == c0
    assert report["deleted_files"] > 0
    assert min(f.version for f in list_log(ob.store.uri)) == c0

    clock.set(clock.now() + timedelta(minutes=1))
    second = run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=clock)
    assert second.mode == "feed"
    assert not second.warnings
    assert {f"{p}{i}" for p in "bcd" for i in range(4)} <= set(second.pending_ids)
    checkpoints.close()


def test_a_trim_past_the_rescuer_makes_it_sweep_and_lose_nothing(workspace: Path) -> None:
    """Someone trims by hand (or Delta's own 30-day cleanup runs) past the rescuer: the feed is
    gone, the pass says so and sweeps, and every pending document is still rescued."""
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write(ob, 2, "a")
    checkpoints = SqlCheckpointStore(settings.sql_url)
    sink = InMemorySink()
    clock = _later()
    run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=clock)
    _write_and_checkpoint(ob, "bcd")
    trim_log(ob.store.uri, now=clock.now(), retention=timedelta(hours=1), needed=None)
    clock.set(clock.now() + timedelta(minutes=1))
    report = run_pass(ob.store, LocalEngine(), checkpoints, sink, clock=clock)
    assert report.mode == "sweep"
    assert any("FEED UNAVAILABLE" in w.upper() for w in report.warnings)
    assert {f"{p}{i}" for p in "bcd" for i in range(3)} <= set(report.pending_ids)
    checkpoints.close()


def test_trim_is_skipped_when_the_rescuer_checkpoints_cannot_be_read(workspace: Path) -> None:
    ob = bare_outbox(workspace)
    _write_and_checkpoint(ob, "abc")
    before = list_log(ob.store.uri)
    report = trim_log_safely(
        ob.store,
        clock=_later(),
        sql_url=f"sqlite:///{workspace / 'missing.db'}",
        retention_seconds=3600,
    )
    assert "cannot tell which history" in report["skipped"]
    assert list_log(ob.store.uri) == before


@pytest.mark.slow  # seconds each: left out of the fast lane
def test_writers_trim_the_log_as_they_commit(workspace: Path) -> None:
    """With upkeep on, the log stays bounded however many commits are made."""
    settings = Settings(workspace=workspace, compact_every=5, log_retention=15)
    migrate(settings)
    DeltaDocumentStore(settings.table_uri).delta_table.alter.set_table_properties(
        {"delta.checkpointInterval": "5"}
    )
    ob = Outbox.open(settings=settings, create=False, transport="memory", clock=_later())
    trimmers = [x for x in ob._listeners if isinstance(x, AutoLogTrimmer)]
    assert len(trimmers) == 1
    _write(ob, 40, "w")  # eight trims, as 80 commits at every 10 made
    log_files = list_log(settings.table_uri)
    assert trimmers[0].runs >= 7
    assert len(log_files) < 23, len(log_files)  # ~40 commits + 8 checkpoints untrimmed
    assert min(f.version for f in log_files) > 20
    ob.close()


def test_maintain_cli_reports_the_trim_and_can_skip_it(workspace: Path) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write_and_checkpoint(ob, "ab")
    ob.close()
    runner = CliRunner()
    args = ["--workspace", str(workspace), "maintain", "--json"]
    out = runner.invoke(cli_main, [*args, "--no-trim-log"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["log_trim"] is None
    out = runner.invoke(cli_main, args)
    assert out.exit_code == 0, out.output
    trim = json.loads(out.output)["log_trim"]
    # the commits are seconds old: the one-hour retention holds everything back
    assert trim["held_by"] == "retention"
    assert trim["deleted_files"] == 0


def test_log_retention_is_never_shorter_than_the_rescue_delay(workspace: Path) -> None:
    """The rescuer finds its window end among the commits in the log, so the log keeps at least
    one rescue delay; a shorter setting is raised to it (the safe direction), not refused."""
    assert Settings(workspace=workspace, rescue_delay=3600).log_retention == 3600
    assert Settings(workspace=workspace, rescue_delay=60, log_retention=30).log_retention == 60
    assert Settings.load(workspace, env={"OUTBOX_LOG_RETENTION": "2h"}).log_retention == 7200
    with pytest.raises(ConfigurationError, match=r"'log_retention' is invalid: must be positive"):
        Settings(workspace=workspace, log_retention=0)


def test_a_failed_trim_names_the_file_and_never_fails_the_commit(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import outbox.delta.log as log_mod

    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write_and_checkpoint(ob, "abc")
    real = log_mod._filesystem

    class ReadOnly:
        def __init__(self, fs: object) -> None:
            self._fs = fs

        def __getattr__(self, name: str) -> object:
            return getattr(self._fs, name)

        def delete_file(self, path: str) -> None:
            raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(log_mod, "_filesystem", lambda uri, opts: ReadOnly(real(uri, opts)))
    with pytest.raises(
        StoreError, match=r"trimming the Delta log .* failed at _delta_log/0+\.json"
    ):
        trim_log(ob.store.uri, now=_later().now(), retention=timedelta(hours=1), needed=None)

    trimmer = AutoLogTrimmer(
        ob.store, 1, sql_url=settings.sql_url, retention_seconds=3600, clock=_later()
    )
    ob.add_commit_listener(trimmer)
    _write(ob, 1, "after")  # the commit stands; the trim's failure is reported, not raised
    assert DeltaDocumentStore(ob.store.uri).read(["after0"])[1]
    assert trimmer.last is not None
    assert "Permission denied" in trimmer.last["failed"]


def _update(ob: Outbox, doc_id: str, n: int) -> None:
    for i in range(n):
        with ob.unit_of_work() as uow:
            doc = uow.get(doc_id)
            assert doc is not None
            doc.state["n"] = i
            doc.send("Changed", {"n": i}, destination="q")


def test_trim_deletes_the_change_data_files_of_the_commits_it_deletes(workspace: Path) -> None:
    """deltalake's vacuum never deletes ``_change_data`` files (they are never tombstoned); the
    trim takes those of the commits it removes, and leaves every other one."""
    from outbox.delta.fold import fold_table

    ob = bare_outbox(workspace)
    _write(ob, 2, "a")
    _update(ob, "a0", 4)
    fold_table(ob.store, at=0)  # saves append; a fold's MERGE writes change-data files
    _write(ob, 1, "x")  # so the fold's commit is before the checkpoint's version
    c1 = _checkpoint(ob)
    _update(ob, "a1", 4)
    fold_table(ob.store, at=0)
    _checkpoint(ob)
    _update(ob, "a0", 2)
    uri = ob.store.uri
    by_commit = {f.version: change_files(uri, f) for f in list_log(uri) if f.commit}
    doomed = {p for v, paths in by_commit.items() if v < c1 for p in paths}
    kept = {p for v, paths in by_commit.items() if v >= c1 for p in paths}
    assert doomed
    assert kept
    on_disk = {str(p.relative_to(uri)) for p in Path(uri, "_change_data").rglob("*.parquet")}
    assert doomed | kept == on_disk

    report = trim_log(uri, now=_later().now(), retention=timedelta(hours=1), needed=None)
    assert report.keep_from == c1
    assert report.change_files_deleted == len(doomed)
    left = {str(p.relative_to(uri)) for p in Path(uri, "_change_data").rglob("*.parquet")}
    assert left == kept
    import pyarrow as pa

    feed = pa.RecordBatchReader.from_stream(
        DeltaDocumentStore(uri).delta_table.load_cdf(starting_version=c1 + 1)
    ).read_all()
    # the feed of the kept commits reads: the saves' inserts and the fold's deletes
    assert {"insert", "delete"} <= set(feed.column("_change_type").to_pylist())


def test_an_idle_writer_recovers_after_the_log_was_trimmed_past_it(workspace: Path) -> None:
    """Regression: the store skipped refreshing when ``<version+1>.json`` was absent, which a
    trim makes true for ever for a handle it left behind; saves then failed and reads were
    stale."""
    idle = bare_outbox(workspace)
    busy = Outbox(idle.settings, DeltaDocumentStore(idle.store.uri), clock=idle.clock)
    _write(idle, 1, "idle")
    _write_and_checkpoint(busy, "abc")
    _write(busy, 1, "last")
    report = trim_log(idle.store.uri, now=_later().now(), retention=timedelta(hours=1), needed=None)
    assert report.keep_from is not None
    assert report.keep_from > idle.store.delta_table.version() + 1
    assert idle.store.read(["a0"])[1]  # reads see the busy writer's documents
    _write(idle, 1, "after")  # and saves succeed
    assert busy.store.read(["after0"])[1]


def test_plan_boundaries_needed_on_a_checkpoint_and_retention_exactly_at_a_commit() -> None:
    files = _files(350, [100, 200, 300], 350)
    assert plan_trim(files, cutoff=_cutoff(350), needed=200).keep_from == 200
    assert plan_trim(files, cutoff=_cutoff(350), needed=199).keep_from == 100
    # commit 200 is exactly at the cutoff: old enough
    assert plan_trim(files, cutoff=T0 + timedelta(seconds=200), needed=None).keep_from == 200
    assert plan_trim(files, cutoff=T0 + timedelta(seconds=199.5), needed=None).keep_from == 100


def test_a_multi_part_checkpoint_counts_only_when_every_part_is_there() -> None:
    files = _files(350, [100, 300], 350)
    files += [
        LogFile(
            f"_delta_log/{200:020d}.checkpoint.{i:010d}.{3:010d}.parquet",
            200,
            T0,
            False,
            True,
            (i, 3),
        )
        for i in (1, 2)  # part 3 of 3 is missing: a writer died half-way
    ]
    assert plan_trim(files, cutoff=_cutoff(350), needed=None).keep_from == 100
    files.append(
        LogFile(
            f"_delta_log/{200:020d}.checkpoint.{3:010d}.{3:010d}.parquet",
            200,
            T0,
            False,
            True,
            (3, 3),
        )
    )
    assert plan_trim(files, cutoff=_cutoff(350), needed=None).keep_from == 200


def test_a_rescuer_checkpoint_holds_the_log_whatever_spelling_of_the_uri_it_used(
    workspace: Path,
) -> None:
    """The rescuer may reach the table as ``file:///…/documents/``; its checkpoint names the
    table id as well, and that is what holds the log."""
    settings = Settings(workspace=workspace)
    migrate(settings)
    ob = bare_outbox(workspace)
    _write(ob, 2, "a")
    c0 = _checkpoint(ob)
    checkpoints = SqlCheckpointStore(settings.sql_url)
    other = DeltaDocumentStore(f"file://{ob.store.uri}/")
    run_pass(other, LocalEngine(), checkpoints, InMemorySink(), clock=_later())
    checkpoints.close()
    _write_and_checkpoint(ob, "bcd")
    report = trim_log_safely(
        ob.store, clock=_later(), sql_url=settings.sql_url, retention_seconds=3600
    )
    assert report["held_by"] == "rescuer"
    assert report["keep_from_version"] == c0


def test_rescue_delay_longer_than_log_retention_is_one_clear_line(workspace: Path) -> None:
    settings = Settings(workspace=workspace)
    migrate(settings)
    out = CliRunner().invoke(cli_main, ["-w", str(workspace), "rescue", "--delay", "30m"])
    assert out.exit_code == 1
    assert out.output.startswith("error: --delay 30m")
    assert "longer than log_retention (15m00s)" in out.output
    assert "Traceback" not in out.output


def _data_files(uri: str) -> set[str]:
    return {
        str(p.relative_to(uri))
        for p in Path(uri).rglob("*.parquet")
        if "_delta_log" not in p.parts and "_change_data" not in p.parts
    }


def test_trim_deletes_the_data_files_its_commits_removed_and_never_a_live_one(
    workspace: Path,
) -> None:
    """The versions layout leaves a small file per save, folded and compacted away later; the
    trim is their vacuum: a file a trimmed commit removed belongs to no snapshot it keeps."""
    from outbox.app.maintenance import live_files
    from outbox.delta.compaction import compact
    from outbox.delta.log import commit_actions, removed_by

    ob = bare_outbox(workspace)
    uri = ob.store.uri
    _write(ob, 4, "a")
    _update(ob, "a0", 3)
    compact(ob.store)  # removes every small file so far
    _write(ob, 1, "x")  # the checkpoint after the compaction: the trim takes the compaction
    c1 = _checkpoint(ob)
    _write(ob, 3, "b")
    _update(ob, "b0", 2)
    compact(ob.store)  # removes files too, in a commit the trim keeps
    _checkpoint(ob)
    _write(ob, 1, "c")
    removed_before = set().union(*(removed_by(commit_actions(uri, v))[0] for v in range(c1)))
    removed_after = set().union(
        *(removed_by(commit_actions(uri, v))[0] for v in range(c1, ob.store.version() + 1))
    )
    live = live_files(ob.store)
    assert removed_before
    assert removed_after
    assert removed_before <= _data_files(uri)

    plain = trim_log(
        uri, now=_later().now(), retention=timedelta(hours=1), needed=None, dry_run=True
    )
    assert plain.data_files_deleted == 0  # a dry run deletes nothing
    report = trim_log(
        uri, now=_later().now(), retention=timedelta(hours=1), needed=None, live_files=live
    )
    assert report.keep_from == c1
    assert report.data_files_deleted == len(removed_before - live)
    left = _data_files(uri)
    assert not (removed_before - live) & left
    assert live <= left  # every file of the current snapshot stays
    assert removed_after <= left  # and every file a kept commit removed (older snapshots read it)

    fresh = DeltaDocumentStore(uri)
    _, rows = fresh.read([f"a{i}" for i in range(4)] + ["b0", "c0"])
    assert len(rows) == 6
    import pyarrow as pa

    feed = pa.RecordBatchReader.from_stream(
        fresh.delta_table.load_cdf(starting_version=c1 + 1)
    ).read_all()
    assert feed.num_rows > 0  # the kept commits' feed still reads


def test_the_writers_trim_deletes_removed_data_files_too(workspace: Path) -> None:
    from outbox.delta.compaction import compact

    ob = bare_outbox(workspace)
    uri = ob.store.uri
    _write(ob, 3, "a")
    _update(ob, "a0", 2)
    compact(ob.store)
    _write(ob, 1, "x")
    _checkpoint(ob)
    _write(ob, 2, "b")
    _checkpoint(ob)
    migrate(ob.settings)
    report = trim_log_safely(
        ob.store, clock=_later(), sql_url=ob.settings.sql_url, retention_seconds=3600
    )
    assert report["data_files_deleted"] > 0  # the saves' files the compaction replaced
    assert len(DeltaDocumentStore(uri).read(["a0", "a1", "a2", "b0", "b1"])[1]) == 5

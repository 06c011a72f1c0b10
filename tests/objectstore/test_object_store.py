"""Every part of the product on a table in an object store (issue 32): Azure (Azurite) and S3
(moto's server), through the library and through the CLI, with the settings a user writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outbox.app.cli import main as cli_main
from outbox.app.facade import Outbox
from outbox.delta.repair import find_duplicates
from outbox.unit_of_work import UnitOfWork
from tests.objectstore.conftest import Remote


def workspace_on(remote: Remote, ws: Path, **settings: Any) -> Path:
    """A workspace whose ``outbox.toml`` puts the table on ``remote`` (as a user would)."""
    ws.mkdir(parents=True, exist_ok=True)
    lines = [f'table_uri = "{remote.uri()}"']
    lines += [f'{k} = "{v}"' for k, v in settings.items()]
    lines.append("[storage_options]")
    lines += [f'{k} = "{v}"' for k, v in remote.storage_options.items()]
    (ws / "outbox.toml").write_text("\n".join(lines) + "\n")
    return ws


def cli(ws: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli_main, [*args, "--json"], env={"OUTBOX_WORKSPACE": str(ws)})
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _write(ob: Outbox, prefix: str, n: int, *, dispatch: bool = True) -> None:
    """``dispatch=False``: commits no dispatcher sees, as when the process dies after them."""
    for i in range(n):
        uow = ob.unit_of_work() if dispatch else UnitOfWork(ob.store, ob.settings, ob.clock)
        with uow:
            doc = uow.get(f"{prefix}{i}") or uow.create(f"{prefix}{i}", type="Shipment")
            doc.state["n"] = i
            doc.send("ShipmentStatusChanged", {"n": i}, destination="shipments")


def _write_together(ob: Outbox, prefix: str, n: int) -> None:
    """``n`` documents in one unit of work: one commit, with a file in each bucket it touches
    (``_write``'s commit a document costs a table read and a commit on the store each)."""
    ids = [f"{prefix}{i}" for i in range(n)]
    with ob.unit_of_work() as uow:
        found = uow.get_many(ids)
        for i, doc_id in enumerate(ids):
            doc = found.get(doc_id) or uow.create(doc_id, type="Shipment")
            doc.state["n"] = i
            doc.send("ShipmentStatusChanged", {"n": i}, destination="shipments")


def _rescue_an_hour_later(ws: Path) -> int:
    """One rescue pass whose "now" is an hour ahead, so the documents are old enough."""
    from datetime import UTC, datetime, timedelta

    from outbox.app.rescue import open_rescuer
    from outbox.core.clock import ManualClock, SystemClock
    from outbox.core.settings import Settings

    later = ManualClock(datetime.now(UTC) + timedelta(hours=1))
    with open_rescuer(Settings.load(ws), clock=later, queue_clock=SystemClock()) as rescuer:
        return rescuer.rescue_pass.run(full=True).commands_enqueued


def test_write_dispatch_rescue_maintain_and_status(remote: Remote, tmp_path: Path) -> None:
    ws = workspace_on(remote, tmp_path / "ws", default_destination="shipments")
    assert cli(ws, "migrate")
    with Outbox.open(ws) as ob:
        assert ob.store.uri == remote.uri()
        _write_together(ob, "a", 6)  # immediate dispatch to the SQL queue
        _write_together(ob, "a", 3)  # a second version of three of them
        _write(ob, "b", 2, dispatch=False)  # left for the rescuer
    status = cli(ws, "status")
    assert status["pending_documents"] == 2
    assert _rescue_an_hour_later(ws) == 2  # the CLI's pass would wait out rescue_delay
    done = cli(ws, "run-dispatcher", "--until-idle")
    assert (done["completed"], done["messages_sent"]) == (2, 2)
    assert cli(ws, "status")["pending_documents"] == 0
    kept = cli(ws, "maintain")
    assert "skipped" not in kept["compacted"], kept
    assert kept["duplicates"]["duplicated_versions"] == 0
    with Outbox.open(ws) as ob:
        rows = ob.store.read([f"a{i}" for i in range(6)] + ["b0", "b1"])[1]
        assert len(rows) == 8
        assert all(r.dispatched_seq == r.last_seq for r in rows.values())
    # the trace: its commit index built from the store's files (read in parallel there), the
    # same answer as the change data feed; the rescued document shows the pass that commanded it
    for doc_id in ("a1", "b0"):
        traced = cli(ws, "trace", doc_id)
        assert traced == cli(ws, "trace", doc_id, "--no-index"), doc_id
        assert len(traced["documents"][0]["commits"]) >= 2
    assert len(cli(ws, "trace", "b0")["documents"][0]["rescues"]) == 1


def test_maintenance_takes_the_lease_and_a_second_maintainer_skips(
    remote: Remote, tmp_path: Path
) -> None:
    """What keeps two compactions of a remote table apart: the lease in the SQL database. Held
    by another maintainer, `outbox maintain` skips its compaction and says who holds it."""
    from outbox.app.lease import maintenance_lease
    from outbox.core.clock import SystemClock

    ws = workspace_on(remote, tmp_path / "ws", default_destination="shipments")
    with Outbox.open(ws) as ob:
        _write_together(ob, "d", 12)
        _write_together(ob, "d", 12)  # a second file in each bucket: something to compact
        settings, table_id = ob.settings, ob.store.table_id
    with maintenance_lease(settings.sql_url, table_id, clock=SystemClock()) as held:
        assert held is None  # this test is the other maintainer
        skipped = cli(ws, "maintain")
        assert "another maintainer holds the table" in skipped["compacted"]["skipped"]
    done = cli(ws, "maintain")
    assert "skipped" not in done["compacted"], done  # the lease is free: it compacted
    assert done["compacted"]["total_considered_files"] > 0, done


def test_two_compactions_of_one_version_duplicate_rows_on_an_object_store(
    remote: Remote, tmp_path: Path
) -> None:
    """Why the lease: on an object store nothing else stops two compactions of one snapshot,
    and deltalake commits both (every row they rewrote then twice); `outbox maintain --repair`
    puts the table right."""
    from deltalake import DeltaTable

    ws = workspace_on(remote, tmp_path / "ws", default_destination="shipments")
    with Outbox.open(ws) as ob:
        _write_together(ob, "e", 12)
        _write_together(ob, "e", 12)  # a second file in each bucket: both compactions rewrite it
        opts = remote.storage_options
        first = DeltaTable(remote.uri(), storage_options=opts)
        second = DeltaTable(remote.uri(), storage_options=opts)
        first.optimize.compact()
        second.optimize.compact()
        assert find_duplicates(ob.store).pairs > 0
    fixed = cli(ws, "maintain", "--repair")
    assert fixed["duplicates"]["rows_removed"] > 0
    with Outbox.open(ws) as ob:
        assert find_duplicates(ob.store).pairs == 0
        assert len(ob.store.read([f"e{i}" for i in range(12)])[1]) == 12


@pytest.mark.slow
def test_a_sigkilled_writer_is_rescued(remote: Remote, tmp_path: Path) -> None:
    """The application process dies right after its commit (SIGKILL): the rescuer finds every
    message it left and the worker delivers them, once each."""
    from tests.dispatcher import procs
    from tests.dispatcher.recovery import recover_and_verify
    from tests.dispatcher.test_crash_recovery import N_DOCS, N_MSGS, run_child

    ws = workspace_on(remote, tmp_path / "ws")
    Outbox.open(ws).close()
    code = run_child(procs.writer, str(ws), N_DOCS, N_MSGS, "after_commit=kill", 2)
    assert code == -9
    report, ob = recover_and_verify(ws)
    with ob:
        assert report.committed > 0
        assert report.ok, report.describe()


@pytest.mark.slow
def test_two_maintainers_started_together_leave_no_duplicates(
    remote: Remote, tmp_path: Path
) -> None:
    """The issue's scenario, through real processes: two `outbox maintain` started together,
    rounds with commits between. Without the lease this duplicated 38 to 962 rows; with it, one
    compacts and the other skips (the held-lease test above shows the skip deterministically).
    The two maintainer processes start once and run `outbox maintain` in themselves at each
    round's signal (``maintainer_proc``), both within a poll of each other."""
    import multiprocessing
    import time

    from tests.objectstore.maintainer_proc import maintainer

    ws = workspace_on(remote, tmp_path / "ws", default_destination="shipments")
    signals = tmp_path / "signals"
    signals.mkdir()
    ctx = multiprocessing.get_context("spawn")
    both = [
        ctx.Process(target=maintainer, args=(str(ws), 3, str(signals), me)) for me in ("a", "b")
    ]
    for p in both:
        p.start()
    try:
        for round_ in range(3):
            with Outbox.open(ws) as ob:  # two commits: a file in each bucket of 8 documents each
                _write_together(ob, f"r{round_}-", 8)
                _write_together(ob, f"r{round_}-", 8)
            (signals / f"go-{round_}").touch()
            done = [signals / f"done-{round_}-{me}" for me in ("a", "b")]
            end = time.monotonic() + 300
            while not all(d.exists() for d in done):
                assert all(p.exitcode in (None, 0) for p in both), "a maintainer died"
                assert time.monotonic() < end, f"round {round_}: the maintainers did not finish"
                time.sleep(0.05)
            results = [d.read_text() for d in done]
            assert [r.partition("\n")[0] for r in results] == ["0", "0"], results
        for p in both:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in both:
            if p.is_alive():
                p.kill()
                p.join()
    with Outbox.open(ws) as ob:
        assert find_duplicates(ob.store).pairs == 0
        ids = [f"r{r}-{i}" for r in range(3) for i in range(8)]
        assert len(ob.store.read(ids)[1]) == 24

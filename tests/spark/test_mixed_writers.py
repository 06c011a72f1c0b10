"""Mixed writers on one table, real processes: a Spark driver beside ``unit_of_work`` applications.

A Spark driver (``mixed_child spark``) applies ``BATCHES`` batches of ``SPARK_DOCS`` changes, one
message each, to documents in buckets 1-3, while two Python application processes save through
``unit_of_work``: one on documents of its own in bucket 0 (beside the MERGEs, never in their
way) and one on some of the driver's documents, a burst of saves as each batch starts, so they
commit while the MERGE on the same buckets runs (the MERGE loses that race and retries). The
driver is SIGKILLed once, right after its last batch committed and before its dispatch (the
shipped ``after_commit`` crash point), so that batch's messages stay pending: no later batch
carries them out. (It is not restarted: a replay under the same ``txn`` is skipped by Delta,
which ``test_streaming.py`` proves; a second JVM start would double this test's time.)

Afterwards the rescuer (one pass, its clock past the rescue delay) and the command worker
deliver everything. First with the rescuer made inert (``rescuer-enqueues-nothing``): the killed
batch's messages stay lost, and the check says so (the proof can fail). Then the real rescuer:
no lost update (each document's version, last_seq and state are what the writers' journals
say), no lost message, first deliveries in seq order per document, no phantom, every watermark
at its last_seq, all held by the checker's own truth (the change data feed) and delivery check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from outbox.core.model import bucket_of
from tests.spark.jvm import child_jvm_env
from tests.spark.mixed_child import read_journal

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]

BUCKETS = 4
#: 200 documents a batch: enough to be a real MERGE over all three buckets (and for the inert
#: rescuer to lose hundreds of messages); the proof does not grow with the size, and each
#: document is a message the Python worker delivers twice over (the inert pass, the real one)
SPARK_DOC_COUNT = 200
BATCHES = 2
KILLED_BATCH = BATCHES  # its messages go out through no later batch: only the rescuer can
#: The driver's documents: sp-00000, sp-00001, ... outside bucket 0, the first SPARK_DOC_COUNT
#: of them; the driver builds the same list in Spark SQL from range(SPARK_RANGE).
SPARK_DOCS = [
    d for d in (f"sp-{i:05d}" for i in range(4 * SPARK_DOC_COUNT)) if bucket_of(d, BUCKETS)
][:SPARK_DOC_COUNT]
SPARK_RANGE = int(SPARK_DOCS[-1][3:]) + 1
OWN_DOCS = [d for d in (f"own-{i:03d}" for i in range(64)) if bucket_of(d, 4) == 0][:6]
OVERLAP_DOCS = SPARK_DOCS[:8]
SETTINGS: dict[str, Any] = {
    "buckets": BUCKETS,
    "compact_every": 0,
    "default_destination": "shipments",
    "log_retention": 30 * 24 * 3600,  # the truth is read from the whole change feed
}


def _env(crash: str | None) -> dict[str, str]:
    env = child_jvm_env({**os.environ, "PYTHONPATH": str(REPO)})
    env.pop("OUTBOX_CRASH_AT", None)
    if crash:
        env["OUTBOX_CRASH_AT"] = crash
    return env


def _start(role: str, config: Path, crash: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.mixed_child", role, str(config)],
        cwd=REPO,
        env=_env(crash),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 1200) -> tuple[int, str]:
    """Wait for a child (a generous limit: a JVM on a loaded two-core box takes minutes)."""
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    return proc.returncode, err[-3000:]


def _deliver(ws: Path, log: Path, broken: Any) -> Any:
    """One rescue pass (clock an hour ahead: every commit is past the delay), then the worker
    until the command queue is empty; returns the checker's delivery verdict."""
    from dispatcher.invariants import verify_deliveries
    from dispatcher.worker import DispatcherWorker
    from outbox.app.checker.broker import LogTransport, read_log
    from outbox.app.checker.rescue import OffsetClock
    from outbox.app.checker.truth import read_truth
    from outbox.app.facade import Outbox
    from rescuer.cdf_local import LocalEngine
    from rescuer.checkpoint import InMemoryCheckpointStore
    from rescuer.runner import RescuePass

    with Outbox.open(
        ws, create=False, transport=LogTransport(log, role="worker"), **SETTINGS
    ) as ob:
        sink: Any = ob.backends.command_sink()
        rescuer = RescuePass(
            ob.store,
            LocalEngine(),
            InMemoryCheckpointStore(),
            broken.wrap_sink(sink) if broken else sink,
            clock=OffsetClock(timedelta(hours=1).total_seconds()),
            delay=ob.settings.rescue_delay,
        )
        rescuer.run()
        DispatcherWorker(ob.runtime, batch_size=64, poll_interval=0.01).run(until_idle=True)
        ob.store.refresh()
        truth = read_truth(ob.store.delta_table)
        inv = verify_deliveries(truth.committed, [d.message for d in read_log(log)])
        _, rows = ob.store.read(SPARK_DOCS + OWN_DOCS)
    return truth, inv, rows


@pytest.mark.timeout(1800)
def test_spark_driver_and_python_writers_with_a_kill_after_commit(tmp_path: Path) -> None:
    from outbox.app.checker import mutations
    from outbox.app.facade import Outbox

    ws, log = tmp_path / "ws", tmp_path / "broker.log"
    Outbox.open(ws, transport="memory", **SETTINGS).close()
    cfg: dict[str, Any] = {
        "workspace": str(ws),
        "log": str(log),
        "settings": SETTINGS,
        "app_id": "mixed-writers",
        "batches": BATCHES,
        "spark_range": SPARK_RANGE,
        "own_docs": OWN_DOCS,
        "overlap_docs": OVERLAP_DOCS,
        "burst": 3,
        "spark_journal": str(tmp_path / "spark.jsonl"),
        "own_journal": str(tmp_path / "own.jsonl"),
        "overlap_journal": str(tmp_path / "overlap.jsonl"),
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))

    writers = [_start("own", config), _start("overlap", config)]
    driver = _start("spark", config, crash=f"after_commit@{KILLED_BATCH}=kill")
    code, err = _finish(driver)
    assert code == -9, err  # SIGKILLed by the crash point right after the last batch's commit
    with open(cfg["spark_journal"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "done"}) + "\n")  # the orchestrator gives up on it
    for w in writers:
        code, err = _finish(w)
        assert code == 0, err

    journal = read_journal(cfg["spark_journal"])
    batches = [e for e in journal if e["event"] == "batch"]
    assert [e["batch"] for e in batches] == list(range(1, BATCHES))  # the last one never returned
    assert all(e["written"] == SPARK_DOC_COUNT for e in batches)
    saves = Counter(
        e["doc"]
        for name in ("own_journal", "overlap_journal")
        for e in read_journal(cfg[name])
        if e["event"] == "save"
    )
    # a burst of 3 on each side as each batch's MERGE starts (two cues seen at once: one burst)
    assert 3 <= sum(saves[d] for d in OVERLAP_DOCS) <= 3 * BATCHES
    assert 3 <= sum(saves[d] for d in OWN_DOCS) <= 3 * BATCHES

    # The proof can fail: with an inert rescuer, the killed batch's messages are never sent.
    inert = mutations.get("rescuer-enqueues-nothing")
    _truth, broken_inv, _rows = _deliver(ws, log, inert)
    assert len(broken_inv.lost) >= SPARK_DOC_COUNT - len(OVERLAP_DOCS), broken_inv.describe()

    truth, inv, rows = _deliver(ws, log, None)
    assert inv.ok, inv.describe()
    expected_messages = BATCHES * SPARK_DOC_COUNT + sum(saves.values())
    assert inv.committed == expected_messages  # every message the journals name, no more
    assert truth.seq_gaps == truth.watermark_regressions == truth.changed_content == []
    assert set(rows) == set(SPARK_DOCS) | {d for d in OWN_DOCS if saves[d]}
    for doc_id, row in rows.items():
        spark_commits = BATCHES if doc_id in SPARK_DOCS else 0
        # No lost update: every commit of either writer raised the version once, added its
        # message, and Spark's blind updates kept the state the applications wrote.
        assert row.version == spark_commits + saves[doc_id], doc_id
        assert row.last_seq == spark_commits + saves[doc_id], doc_id
        assert int(row.state.get("py", 0)) == saves[doc_id], doc_id
        assert row.dispatched_seq == row.last_seq, doc_id
    print(
        f"mixed writers: {BATCHES} batches x {SPARK_DOC_COUNT} Spark changes, "
        f"{sum(saves.values())} unit_of_work saves, {inv.committed} messages, "
        f"{inv.delivered} deliveries ({inv.duplicates} duplicates); MERGE attempts lost to a "
        f"concurrent commit and retried: "
        f"{sum(1 for e in journal if e['event'] == 'merging' and e['attempt'] > 1)}; apply "
        f"timings {[e['timings'] for e in batches]}"
    )

"""Exactly once per micro-batch: a driver SIGKILLed between the commit and the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from outbox.core.model import message_id_for
from outbox.delta.store import DeltaDocumentStore
from tests.spark.jvm import child_jvm_env
from tests.spark.stream_child import run_stream
from tests.spark.test_apply import changes

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]


def test_a_repeated_transaction_is_skipped(sob: Any, spark: Any) -> None:
    df = changes(spark, ("a", "t", "{}", None, [("M", "x", None)]))
    first = sob.apply(df, txn=("query-1", 0), dispatch="deferred")
    again = sob.apply(df, txn=("query-1", 0), dispatch="deferred")
    assert first.version is not None
    assert again.skipped
    assert again.version is None
    row = sob.store.read(["a"])[1]["a"]
    assert (row.version, row.last_seq) == (1, 1)
    # Another application id, or the next batch id, is applied.
    assert not sob.apply(df, txn=("query-1", 1), dispatch="deferred").skipped
    assert sob.store.read(["a"])[1]["a"].last_seq == 2


def _run_child(args: list[str], crash: str | None) -> subprocess.CompletedProcess[str]:
    env = child_jvm_env({**os.environ, "PYTHONPATH": str(REPO)})
    env.pop("OUTBOX_CRASH_AT", None)
    if crash:
        env["OUTBOX_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "tests.spark.stream_child", *args],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"batch"')]


@pytest.mark.timeout(1200)  # a driver process starting a JVM of its own
def test_a_driver_killed_after_the_commit_does_not_apply_the_batch_twice(
    tmp_path: Path, spark: Any
) -> None:
    """The killed driver is a child process (SIGKILL); its restart is the same query on the same
    checkpoint, run on this session: a second driver process would only add a JVM start."""
    workspace, source, ckpt = tmp_path / "ws", tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    rows: list[dict[str, Any]] = [
        {
            "id": f"s{i}",
            "type": "scan",
            "state": "{}",
            "messages": [{"type": "Scanned", "body": "b"}],
        }
        for i in range(5)
    ]
    (source / "part-0.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = [str(workspace), str(source), str(ckpt), "scan-query"]

    killed = _run_child(args, "after_commit=kill")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert _lines(killed.stdout) == []  # it died inside foreachBatch, after the MERGE
    store = DeltaDocumentStore(str(workspace / "documents"))
    committed = store.refresh()
    _, docs = store.read([r["id"] for r in rows])
    assert {d.last_seq for d in docs.values()} == {1}

    # A file that arrives meanwhile is the next micro-batch, applied once after the replay.
    (source / "part-1.json").write_text(
        json.dumps({"id": "s0", "type": "scan", "messages": [{"type": "Again", "body": "c"}]})
    )
    restarted: list[dict[str, Any]] = []
    run_stream(spark, *args, on_batch=restarted.append)
    # The streaming checkpoint had not recorded batch 0: it ran again, and Delta skipped it.
    assert [(x["batch"], x["skipped"], x["written"]) for x in restarted] == [
        (0, True, 0),
        (1, False, 1),
    ]
    assert store.refresh() == committed + 2  # batch 1's commit and its watermark MERGE
    _, docs = store.read([r["id"] for r in rows])
    assert docs["s0"].last_seq == 2
    assert {(d.version, d.last_seq) for d in docs.values() if d.id != "s0"} == {(1, 1)}
    for d in docs.values():  # the ids the Python path gives (table, id, seq, incarnation)
        assert d.outbox[0].message_id == message_id_for(
            store.table_id, d.id, d.outbox[0].seq, d.incarnation
        )

"""``outbox replay`` over a range a Spark job wrote: deltalake's change data feed reader refuses
delta-spark's files when it reads their messages ("Cannot cast nullable struct field"), so the
replay reads the range from its files (``outbox.delta.change_files``). Without that fallback the
same replay fails; ``--where`` over such a range is refused in one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.spark.test_trace_life import CHANGES, QUEUE, _cli

pytestmark = pytest.mark.spark


def _spark_range(spark: Any, ws: Path) -> tuple[int, int]:
    """Three documents created by a Spark job, two of them changed by a second: the versions of
    the two jobs' commits."""
    from outbox.app.spark import SparkOutbox

    ws.mkdir()
    (ws / "outbox.toml").write_text(
        f'sql_url = "sqlite:///{ws / "outbox.db"}"\ntransport = "sql"\nbuckets = 4\n'
        f'compact_every = 0\ndefault_destination = "{QUEUE}"\nsample_interval = 0\n'
    )
    sob = SparkOutbox(spark, ws)
    try:
        rows = [(f"o-{i}", "Order", "{}", 0, [("Placed", json.dumps({"i": i}))]) for i in range(3)]
        sob.apply(spark.createDataFrame(rows, CHANGES))
        first = sob.store.refresh()
        rows = [(f"o-{i}", "Order", "{}", 1, [("Paid", json.dumps({"i": i}))]) for i in range(2)]
        sob.apply(spark.createDataFrame(rows, CHANGES))
        last = sob.store.refresh()
    finally:
        sob.close()
    return first, last


def _replayed(ws: Path) -> list[str]:
    with sqlite3.connect(ws / "outbox.db") as con:
        rows = con.execute(
            "SELECT subject FROM outbox_queue_messages WHERE queue = ? AND headers LIKE ? "
            "ORDER BY sequence_number",
            (QUEUE, '%"outbox-replay"%'),
        ).fetchall()
    return [r[0] for r in rows]


def test_a_range_spark_wrote_is_replayed_from_its_files(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    first, last = _spark_range(spark, ws)
    span = ("--from", str(first), "--to", str(last))

    # without the fallback: the feed reader's refusal is the replay's failure
    monkeypatch.setattr("outbox.delta.change_files.spark_written", lambda _e: False)
    broken = _cli(ws, "replay", *span, "--dry-run")
    assert broken.exit_code != 0
    assert "Cannot cast nullable struct field" in broken.output
    monkeypatch.undo()

    dry = _cli(ws, "replay", *span, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    assert plan["by_destination_type"] == [
        {"destination": QUEUE, "type": "Paid", "messages": 2},
        {"destination": QUEUE, "type": "Placed", "messages": 3},
    ]
    # new ids: the originals are still in the queue, whose duplicate detection would drop copies
    started = _cli(ws, "replay", *span, "--new-ids", "--json")
    assert started.exit_code == 0, started.output
    ran = _cli(ws, "run-dispatcher", "--until-idle", "--poll-interval", "10ms")
    assert ran.exit_code == 0, ran.output
    status = _cli(ws, "replay", "--status", "--json")
    assert json.loads(status.stdout)["replays"][0]["status"] == "done", status.stdout
    assert sorted(_replayed(ws)) == ["Paid", "Paid", "Placed", "Placed", "Placed"]

    where = _cli(ws, "replay", *span, "--where", "id = 'o-1'", "--dry-run")
    assert where.exit_code != 0
    [line] = [x for x in where.output.splitlines() if x.strip()][:1]
    assert line.startswith("error: --where")
    assert "Spark wrote" in line
    assert "Traceback" not in where.output

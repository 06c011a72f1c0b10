"""Rows a range holds that are not new: the dispatcher's mark rows and the fold's rewrite of the
kept versions (its MERGE deletes superseded versions and raises the kept row's watermark, a
post-image repeating the row's messages). A replay counts neither: each message once, at the
commit that first wrote it."""

from __future__ import annotations

from pathlib import Path

from dispatcher.transports.memory import InMemoryTransport
from dispatcher.worker import DispatcherWorker
from outbox import Outbox
from outbox.delta.fold import fold_table
from tests.replay.helpers import build_history, cli_json


def test_marks_and_a_fold_in_the_range_add_no_message(tmp_path: Path) -> None:
    h = build_history(tmp_path / "ws")
    memory = InMemoryTransport()
    with Outbox.open(h.ws, transport=memory, command_queue="parked") as ob:
        DispatcherWorker(ob.runtime, poll_interval=0.01).run(until_idle=True)
        assert len(memory.deliveries) == 23  # every message sent once: marks written
        marked = ob.store.refresh()
        report = fold_table(ob.store, at=0.0)
        folded = ob.store.refresh()
    assert marked > h.c
    assert folded > marked, report
    changes = _change_types(h.ws, h.c + 1, folded)
    assert {"update_postimage", "delete"} <= changes  # the fold rewrote kept rows

    after = cli_json(h.ws, "replay", "--from", str(h.c + 1), "--to", str(folded), "--dry-run")
    assert (after["messages"], after["by_destination_type"]) == (0, [])
    whole = cli_json(h.ws, "replay", "--from", "0", "--to", str(folded), "--dry-run")
    assert whole["messages"] == 23
    again = cli_json(h.ws, "replay", "--from", str(h.b), "--to", str(folded), "--dry-run")
    assert again["messages"] == 13


def _change_types(ws: Path, start: int, end: int) -> set[str]:
    import deltalake
    import pyarrow as pa

    dt = deltalake.DeltaTable(str(ws / "documents"))
    reader = dt.load_cdf(starting_version=start, ending_version=end, columns=["_change_type"])
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    return {str(v) for v in table["_change_type"].to_pylist()}

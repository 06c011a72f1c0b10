"""The erasure proof's scenario: a document whose state and message bodies carry a unique
marker, spread over every place an outbox keeps things, then erased and maintained.

Every place is made on purpose and checked before the erasure, so "found nowhere" afterwards
means the erasure removed it, not that it was never there: saves (three versions, data files),
the immediate dispatch's mark rows, a fold (its change data holds the deleted rows in full),
queue rows (the SQL transport), a dead letter, and the data file of an append whose writer died
before committing (no commit names it: only the orphan sweep can find it).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from dispatcher.queue.sql_queue import SqlQueue
from outbox.app.cli import main as cli_main
from outbox.app.facade import Outbox
from outbox.app.maintenance import maintain
from outbox.core.clock import ManualClock
from outbox.core.settings import Settings
from outbox.delta.fold import fold_table
from testkit.raw_scan import Hit, places, scan_folder, scan_table

ERASED = "person-1"
KEPT = "person-2"
QUEUE = "people"


@dataclass
class Scene:
    ws: Path
    marker: str
    settings: Settings

    def cli(self, *args: str) -> Any:
        return CliRunner().invoke(cli_main, list(args), env={"OUTBOX_WORKSPACE": str(self.ws)})

    def table_hits(self, text: str | None = None) -> list[Hit]:
        s = self.settings
        return scan_table(s.table_uri, text or self.marker, dict(s.storage_options) or None)

    def sql_hits(self, text: str | None = None) -> list[Hit]:
        """The workspace folder: the SQLite database, its WAL (and a local table)."""
        folder = Path(str(self.settings.sql_url).removeprefix("sqlite:///")).parent
        return scan_folder(folder, text or self.marker)

    def queue_rows(self) -> int:
        import sqlalchemy as sa

        engine = sa.create_engine(self.settings.sql_url)
        try:
            with engine.connect() as conn:
                n = 0
                for table in ("outbox_queue_messages", "outbox_queue_dead_letters"):
                    n += conn.exec_driver_sql(
                        f"SELECT count(*) FROM {table} WHERE session_id = ?", (ERASED,)
                    ).scalar_one()
                return int(n)
        finally:
            engine.dispose()


def _save(ob: Outbox, doc_id: str, value: str, n: int) -> None:
    with ob.unit_of_work() as uow:
        doc = uow.get(doc_id) or uow.create(doc_id, type="Person")
        doc.state["email"] = value
        doc.state["n"] = n
        doc.send("PersonChanged", {"email": value, "n": n}, destination=QUEUE)


def _orphan(settings: Settings, marker: str) -> None:
    """The data file of an append whose writer died between writing it and committing."""
    from deltalake.fs import DeltaStorageHandler

    handler = DeltaStorageHandler(settings.table_uri, dict(settings.storage_options) or None)
    rows = pa.table({"id": [ERASED], "state": [json.dumps({"email": marker})]})
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink)
    # the raw writer under deltalake's PythonFile (which hands it a pyarrow Buffer, not bytes)
    name = f"bucket=0/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    out = handler._handler.open_output_stream(name, None)
    out.write(sink.getvalue().to_pybytes())
    out.close()


def build(ws: Path, **settings: Any) -> Scene:
    """The workspace of the proof, every place holding the marker (asserted by the caller)."""
    marker = f"mk{uuid.uuid4().hex}"
    with Outbox.open(ws, default_destination=QUEUE, compact_every=0, **settings) as ob:
        for n in range(3):  # three versions, each dispatched at once: mark rows too
            _save(ob, ERASED, f"{marker}@example.org", n)
        _save(ob, KEPT, "kept@example.org", 0)
        fold_table(ob.store, at=0)  # the fold's change data: the superseded rows in full
        _save(ob, ERASED, f"{marker}@example.org", 3)  # and a version after the fold
        conf = ob.settings
    with SqlQueue.from_settings(conf) as queue:
        (msg,) = queue.receive(QUEUE, 1, session_id=ERASED)
        queue.dead_letter(msg, "Poison", "a consumer gave up on it")
    _orphan(conf, marker)
    return Scene(ws, marker, conf)


def maintain_later(scene: Scene, *, rounds: int = 2, fold: bool = True) -> list[dict[str, Any]]:
    """``outbox maintain`` as if ``log_retention`` had passed (an injected clock, no sleep),
    ``rounds`` times, with a save of another document before each (the trim keeps a checkpoint
    and the commits after it, so it passes the erase commit once a second checkpoint follows
    it); each run's ``erasures`` report. ``fold=False``: no fold nor compaction."""
    s = scene.settings
    later = ManualClock(datetime.now(UTC) + timedelta(seconds=s.log_retention + 3600))
    reports = []
    for n in range(rounds):
        with Outbox.open(scene.ws, compact_every=0) as ob:
            _save(ob, KEPT, "kept@example.org", 10 + n)
        with Outbox.open(scene.ws, compact_every=0) as ob:
            report = maintain(
                ob.store,
                clock=later,
                sql_url=s.sql_url,
                rescue_delay_seconds=s.rescue_delay,
                settings=s,
                storage_options=s.storage_options,
                log_retention_seconds=s.log_retention,
                do_compact=fold,
            )
        reports.append(report.erasures)
    return reports


def readers_see(scene: Scene) -> dict[str, Any]:
    """What the readers show of the erased and the kept document."""
    with Outbox.open(scene.ws, compact_every=0) as ob:
        _, rows = ob.store.read([ERASED, KEPT])
        found = ob.store._query(f"SELECT count(*) AS n FROM t WHERE state LIKE '%{scene.marker}%'")
    return {"ids": sorted(rows), "rows_with_marker": int(found["n"][0].as_py())}


__all__ = ["ERASED", "KEPT", "Scene", "build", "maintain_later", "places", "readers_see"]

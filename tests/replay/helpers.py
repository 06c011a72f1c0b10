"""A workspace with a known history for the replay tests, and what the queue received."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from outbox import Outbox
from outbox.app.cli import main


@dataclass
class History:
    """The versions of three units of work and every message they committed, by (doc, seq)."""

    ws: Path
    a: int
    b: int
    c: int
    ids: dict[tuple[str, int], str] = field(default_factory=dict)
    #: destination, type of each (doc, seq)
    kinds: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    #: the version that first committed each (doc, seq)
    versions: dict[tuple[str, int], int] = field(default_factory=dict)

    def committed(self, start: int, end: int) -> dict[str, tuple[str, int]]:
        """message id -> (doc, seq) of the messages first committed in versions start..end."""
        return {
            self.ids[k]: k for k, v in self.versions.items() if start <= v <= end and k in self.ids
        }


def build_history(ws: Path, *, checkpoint_after_a: bool = False) -> History:
    """Three commits, nothing dispatched (deferred, its commands parked in a queue the CLI's
    worker does not read), so every later save of a document repeats its earlier messages:

    * a: d0..d9 created, each ``Created`` to shipments (seq 1);
    * b: d0..d4 ``Moved`` to shipments (seq 2) and ``Billed`` to billing (seq 3);
    * c: d10, d11 created (``Created``), d5 ``Moved`` (seq 2).

    ``checkpoint_after_a``: a Delta checkpoint at version a (the log trim keeps from one).
    """
    with Outbox.open(
        ws,
        transport="memory",
        dispatch="deferred",
        command_queue="parked",
        default_destination="shipments",
    ) as ob:
        h = History(ws, 0, 0, 0)
        with ob.unit_of_work() as uow:
            for i in range(10):
                uow.create(f"d{i}", type="Package").send("Created", {"n": i})
        h.a = ob.store.refresh()
        if checkpoint_after_a:  # a checkpoint the log trim can keep from
            from outbox.app.maintenance import checkpoint

            checkpoint(ob.store)
        with ob.unit_of_work() as uow:
            for i in range(5):
                doc = uow.get(f"d{i}")
                assert doc is not None
                doc.send("Moved", {"n": i})
                doc.send("Billed", {"n": i}, destination="billing")
        h.b = ob.store.refresh()
        with ob.unit_of_work() as uow:
            for i in (10, 11):
                uow.create(f"d{i}", type="Package").send("Created", {"n": i})
            d5 = uow.get("d5")
            assert d5 is not None
            d5.send("Moved", {"n": 5})
        h.c = ob.store.refresh()
        _, rows = ob.store.read([f"d{i}" for i in range(12)])
        for doc_id, row in rows.items():
            for m in row.outbox:
                h.ids[(doc_id, m.seq)] = m.message_id
                h.kinds[(doc_id, m.seq)] = (m.destination, m.type)
    for i in range(12):
        h.versions[(f"d{i}", 1)] = h.a if i < 10 else h.c
    for i in range(5):
        h.versions[(f"d{i}", 2)] = h.versions[(f"d{i}", 3)] = h.b
    h.versions[("d5", 2)] = h.c
    return h


def cli(ws: Path, *args: str) -> Result:
    """``outbox -w WS ARGS`` in this process (so a test's crash points and patches apply)."""
    return CliRunner().invoke(
        main, ["-w", str(ws), *args], catch_exceptions=False, prog_name="outbox"
    )


def cli_json(ws: Path, *args: str) -> Any:
    result = cli(ws, *args, "--json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def delivered(ws: Path, queues: tuple[str, ...] = ("shipments", "billing")) -> list[dict[str, Any]]:
    """What the SQL transport put in the destination queues, in sequence order."""
    with sqlite3.connect(ws / "outbox.db") as con:
        rows = con.execute(
            "SELECT queue, message_id, session_id, headers FROM outbox_queue_messages "
            f"WHERE queue IN ({', '.join('?' for _ in queues)}) ORDER BY sequence_number",
            queues,
        ).fetchall()
    return [
        {"queue": q, "message_id": m, "session_id": s, "headers": json.loads(hd)}
        for q, m, s, hd in rows
    ]


def more_versions(ws: Path, n: int, *, checkpoint_each: bool = True) -> int:
    """``n`` more commits (a document each), each followed by a checkpoint; the newest version."""
    from outbox.app.maintenance import checkpoint

    with Outbox.open(ws, transport="memory", dispatch="deferred", command_queue="parked") as ob:
        for i in range(n):
            with ob.unit_of_work() as uow:
                uow.create(f"later-{i}", type="Package")
            if checkpoint_each:
                checkpoint(ob.store)
        return ob.store.refresh()

"""``outbox erase --pending send`` through a tombstone, and ``--where`` over the current
documents (docs/erasure.md, "Pending messages" and the selectors).

The erase deletes each document through the library first (``uow.delete``), sends what the
tombstone carries, then erases the rows. A save between the erase's read and its tombstone is
followed by the tombstone (its messages sent too); a writer that read before the tombstone and
commits after it is refused. The races are stepped into at fixed points (``_live_documents``,
``erase_rows``), never timed.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from outbox.app import erasure
from outbox.app.cli import erase as erase_cli
from outbox.app.cli import main
from outbox.app.facade import Outbox
from outbox.core.errors import ConcurrencyError
from outbox.core.model import DocumentRow
from outbox.core.settings import Settings
from tests.erasure.scenario import ERASED, KEPT, QUEUE, Scene, maintain_later, places
from tests.erasure.test_purge import sqlite_without_secure_delete


def _run(ws: Path, *args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"OUTBOX_WORKSPACE": str(ws)})


def _rows_of(ws: Path, doc_id: str) -> int:
    with Outbox.open(ws, compact_every=0) as ob:
        found = ob.store._query(f"SELECT count(*) AS n FROM t WHERE id = '{doc_id}'")
    return int(found["n"][0].as_py())


def _sqlite_hits(scene: Scene, text: str | None = None) -> list[Any]:
    """The SQLite database and its WAL only (the workspace folder also holds the table)."""
    db = Path(str(scene.settings.sql_url).removeprefix("sqlite:///")).name
    return [h for h in scene.sql_hits(text) if h.path.startswith(db)]


def _record_sends(monkeypatch: pytest.MonkeyPatch, after: Any = None) -> list[Any]:
    """What the erase hands the dispatcher: (id, tombstone?, seqs unsent) per row."""
    sent: list[Any] = []
    real = erase_cli._send

    def send(settings: Settings, store: Any, rows: list[DocumentRow]) -> None:
        sent.extend(
            (r.id, r.deleted, [m.seq for m in r.outbox if m.seq > r.dispatched_seq]) for r in rows
        )
        real(settings, store, rows)
        if after is not None:
            after()

    monkeypatch.setattr(erase_cli, "_send", send)
    return sent


def test_pending_send_goes_through_a_tombstone_and_leaves_the_marker_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document whose message is not sent (deferred dispatch, no worker): the erase deletes
    it, sends the message its tombstone carries (a queue row holding the marker), erases the
    rows and purges the queue row; after `outbox maintain` past log_retention no file holds the
    marker or the id."""
    ws = tmp_path / "ws"
    marker = f"mk{uuid.uuid4().hex}"
    for doc_id, value, dispatch in ((KEPT, "kept", "immediate"), (ERASED, marker, "deferred")):
        with (
            Outbox.open(ws, default_destination=QUEUE, compact_every=0, dispatch=dispatch) as ob,
            ob.unit_of_work() as uow,
        ):
            doc = uow.create(doc_id, type="Person", state={"email": value})
            doc.send("PersonCreated", {"email": value}, destination=QUEUE)
            settings = ob.settings
    scene = Scene(ws, marker, settings)
    with sqlite_without_secure_delete():
        assert "data" in places(scene.table_hits())
        assert _sqlite_hits(scene) == []  # a deferred command names the document, not its body
        queued: list[bool] = []
        sent = _record_sends(monkeypatch, after=lambda: queued.append(bool(_sqlite_hits(scene))))
        result = scene.cli("erase", "--id", ERASED, "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert (report["tombstoned"], report["erased"], report["still_pending"]) == (
            [ERASED],
            [ERASED],
            [],
        )
        assert sent == [(ERASED, True, [1])]  # the tombstone carried the unsent message
        assert queued == [True]  # it reached the queue, marker and all
        assert report["sql_rows_deleted"]["outbox_queue_messages"] == 2  # its command, its message
        assert _sqlite_hits(scene) == []
        assert _rows_of(ws, ERASED) == 0
        assert [m["finished"] for m in maintain_later(scene)] == [0, 1]
        assert scene.table_hits() == []
        assert scene.table_hits(ERASED) == []
        assert scene.sql_hits() == []
        assert scene.sql_hits(ERASED) == []


def test_a_racing_save_is_followed_by_the_tombstone_a_later_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after the erase read p1 for its tombstone, a writer saves p1 (message 2), and a
    second writer reads p1. The tombstone's commit conflicts; the erase reads again and writes
    the tombstone over the save, which carries messages 1 and 2. The second writer commits after
    the send, before the erase's MERGE: its version would be erased unsent, so it is refused."""
    ws = tmp_path / "ws"
    with (
        Outbox.open(ws, default_destination=QUEUE, compact_every=0, dispatch="deferred") as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("p1", type="Person").send("Created", {"n": 1})
    writer = Outbox.open(ws, default_destination=QUEUE, compact_every=0, dispatch="deferred")
    late = writer.unit_of_work()
    reads: list[int] = []
    outcome: list[str] = []
    live_documents = erasure._live_documents
    erase_rows = erasure.erase_rows

    def read_then_a_save(uow: Any, ids: Any) -> Any:
        docs = live_documents(uow, ids)
        reads.append(len(docs))
        if len(reads) == 1:
            with writer.unit_of_work() as racing:
                doc = racing.get("p1")
                assert doc is not None
                doc.state["n"] = 2
                doc.send("Changed", {"n": 2})
            assert late.get("p1") is not None  # read after that save, before the tombstone
        return docs

    def a_late_save_then_erase(*args: Any, **kwargs: Any) -> int:
        doc = late.get("p1")
        assert doc is not None
        doc.state["n"] = 3
        doc.send("Changed", {"n": 3})
        try:
            late.commit()
            outcome.append("committed")
        except ConcurrencyError:
            outcome.append("refused")
        return erase_rows(*args, **kwargs)

    monkeypatch.setattr(erasure, "_live_documents", read_then_a_save)
    monkeypatch.setattr(erasure, "erase_rows", a_late_save_then_erase)
    sent = _record_sends(monkeypatch)
    try:
        result = _run(ws, "erase", "--id", "p1", "--json")
    finally:
        writer.close()
    assert result.exit_code == 0, result.output
    assert outcome == ["refused"]  # nothing follows the tombstone
    assert sent == [("p1", True, [1, 2])]  # the racing save's message left with the tombstone
    report = json.loads(result.stdout)
    assert (report["tombstone_conflicts"], report["tombstoned"], report["erased"]) == (
        1,
        ["p1"],
        ["p1"],
    )
    assert reads == [1, 1]
    assert report["sql_rows_deleted"]["outbox_queue_messages"] == 4  # 2 commands, 2 messages
    assert _rows_of(ws, "p1") == 0


def _documents(ws: Path) -> Any:
    with Outbox.open(ws, compact_every=0) as ob:
        return ob.documents(include_deleted=True)


def _dry(ws: Path, where: str) -> list[str]:
    result = _run(ws, "erase", "--where", where, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    return list(json.loads(result.stdout)["ids"])


def test_where_selects_what_the_readers_show_tombstones_included(tmp_path: Path) -> None:
    """s1's message was sent (a mark row holds its watermark), u1's not; t1 was deleted by the
    application and its last message is not sent yet, so its tombstone is still in the table.
    ``--where`` runs over ``current_sql`` with tombstones: the folded watermark, ``deleted``."""
    ws = tmp_path / "ws"
    with (
        Outbox.open(ws, default_destination=QUEUE, compact_every=0) as ob,
        ob.unit_of_work() as uow,
    ):
        uow.create("s1", type="Person", state={"tier": "gold"}).send("Created", {})
    with Outbox.open(ws, default_destination=QUEUE, compact_every=0, dispatch="deferred") as ob:
        with ob.unit_of_work() as uow:
            uow.create("u1", type="Person", state={"tier": "gold"}).send("Created", {})
            uow.create("o1", type="Order", state={"tier": "silver"})
            uow.create("t1", type="Person", state={"tier": "gold"}).send("Created", {})
        with ob.unit_of_work() as uow:
            uow.delete("t1")
    docs = _documents(ws)
    assert _dry(ws, "type = 'Person'") == ["s1", "t1", "u1"]  # t1 deleted, not erased yet
    assert _dry(ws, "type = 'Person' AND deleted") == ["t1"]
    pending = docs.filter(pc.less(docs["dispatched_seq"], docs["last_seq"]))
    assert _dry(ws, "dispatched_seq < last_seq") == pending["id"].to_pylist() == ["t1", "u1"]
    states = zip(docs["id"].to_pylist(), docs["state"].to_pylist(), strict=True)
    gold = [i for i, state in states if "gold" in state]
    assert _dry(ws, "state LIKE '%gold%'") == gold == ["s1", "u1"]

    done = _run(ws, "erase", "--where", "deleted", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert (report["ids"], report["tombstoned"], report["erased"]) == (["t1"], [], ["t1"])
    assert _rows_of(ws, "t1") == 0
    assert _documents(ws)["id"].to_pylist() == ["o1", "s1", "u1"]

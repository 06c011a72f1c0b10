"""One document table taken through every state the versions layout passes through, with a
plain-Python model of its documents at every table version.

Why one table: a reader must be right on the table as it is in production, where every state
leaves its rows behind for the next (a fold's raised row beside a later save, a foreign delete's
late mark beside the re-created life); states built apart would each be easy. The model is
independent of the rule the readers apply (``outbox.delta.current``): it is updated from what
each step *means* (a save is the next version; a watermark raises its life's; a fold or a
compaction changes no document; a foreign delete ends the document and a late mark of its life
counts for nothing; a tombstone hides it), never from the rows. tests/readers compares every
reader with it at every version; the Spark readers in tests/spark/test_current_view.py.

The steps (``STEPS``): saves; updates; watermarks as unfolded mark rows; a fold; a save and a
mark after it; a compaction; legacy rows (a null incarnation) and their mark; a foreign physical
DELETE; a late mark of the deleted life (a marks-only id); a re-create with a new life; the
``deleted`` column added (schema version 3's, by hand: the delete part's migration adds it); a
hand-appended tombstone, then its watermark; an undispatched tombstone; a re-create over a
tombstone (the next version, a new life).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from outbox.app.facade import Outbox
from outbox.core.model import DocumentRow, new_incarnation
from outbox.delta import schema as S
from outbox.delta.store import DocumentWrite

#: The tombstone column (``outbox.delta.schema.DELETED``, spelt out: the model does not import
#: the rule it checks).
DELETED = "deleted"
#: The columns the model knows, as a reader returns them (``state`` parsed).
MODELLED = ("id", "type", "version", "state", "last_seq", "dispatched_seq", "incarnation")

Doc = dict[str, Any]


@dataclass
class TableStates:
    """The table of ``ob`` (a bare outbox on a fresh table) and its model, version by version."""

    ob: Outbox
    #: The model now: id -> document (``MODELLED`` keys and ``deleted``).
    model: dict[str, Doc] = field(default_factory=dict)
    #: Every table version -> the model's documents at it.
    at: dict[int, dict[str, Doc]] = field(default_factory=dict)
    #: Every table version -> the step that made it.
    step_of: dict[int, str] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    has_deleted_column: bool = False

    def __post_init__(self) -> None:
        self.record("created")

    @property
    def uri(self) -> str:
        return self.ob.store.uri

    # --- the record ------------------------------------------------------------------------

    def record(self, step: str) -> int:
        """The model now is the model of every version committed since the last record (a step
        of several commits, a fold's or a compaction's, changes no document)."""
        version = self.ob.store.refresh()
        last = max(self.at, default=-1)
        for v in range(last + 1, version + 1):
            self.at[v] = copy.deepcopy(self.model)
            self.step_of[v] = step
        return version

    def documents(self, version: int, *, include_deleted: bool = False) -> dict[str, Doc]:
        """The expected documents at ``version``: ``MODELLED`` columns (and ``deleted`` with
        ``include_deleted``), by id."""
        out = {}
        for i, doc in sorted(self.at[version].items()):
            if doc[DELETED] and not include_deleted:
                continue
            keys = (*MODELLED, DELETED) if include_deleted else MODELLED
            out[i] = {k: doc[k] for k in keys}
        return out

    # --- the steps -------------------------------------------------------------------------

    def save(
        self, doc_id: str, state: dict[str, Any], *, type: str = "", messages: int = 1
    ) -> None:
        """Create (with ``type``) or update ``doc_id`` through a unit of work."""
        with self.ob.unit_of_work() as uow:
            doc = uow.get(doc_id)
            if doc is None:
                doc = uow.create(doc_id, type=type, state=state)
            else:
                doc.state.clear()
                doc.state.update(state)
            for n in range(messages):
                doc.send("Changed", {"n": n}, destination="q")
            incarnation = doc.incarnation
        mine = self.model.get(doc_id)
        if mine is None or mine[DELETED]:
            self.model[doc_id] = _doc(doc_id, type, 1, state, messages, life=incarnation)
        else:
            mine.update(version=mine["version"] + 1, state=state)
            mine["last_seq"] += messages
        self.ids.add(doc_id)
        self.record(f"save {doc_id}")

    def legacy(self, doc_id: str, state: dict[str, Any], *, last_seq: int) -> None:
        """A document written before incarnations: its first version with a null incarnation."""
        store = self.ob.store
        row = DocumentRow(doc_id, "Legacy", 1, state, last_seq, 0, [], incarnation=None)
        store.save([DocumentWrite(row, 0, store.refresh())])
        self.model[doc_id] = _doc(doc_id, "Legacy", 1, state, last_seq, life=None)
        self.ids.add(doc_id)
        self.record(f"legacy {doc_id}")

    def mark(self, doc_id: str, seq: int, life: str | None) -> None:
        """The dispatcher's watermark for the life ``life`` (a mark row; maybe of a life that
        ended: then it counts for no document)."""
        if self.has_deleted_column:
            self._append([_mark_row(doc_id, seq, life, self.ob.store.bucket(doc_id))])
        else:
            assert self.ob.store.advance_watermarks({doc_id: seq}, {doc_id: life}) is not None
        mine = self.model.get(doc_id)
        if mine is not None and mine["incarnation"] == life:
            mine["dispatched_seq"] = max(mine["dispatched_seq"], seq)
        self.record(f"mark {doc_id}")

    def life(self, doc_id: str) -> str | None:
        return str(self.model[doc_id]["incarnation"]) if self.model[doc_id]["incarnation"] else None

    def fold(self) -> None:
        from outbox.delta.fold import fold_table

        fold_table(self.ob.store, at=0)
        self.record("fold")

    def compact(self) -> None:
        from outbox.delta.compaction import compact

        compact(self.ob.store)
        self.record("compaction")

    def foreign_delete(self, doc_id: str) -> None:
        """A physical DELETE by another writer: every row of the id goes."""
        store = self.ob.store
        store.refresh()
        store.delta_table.delete(f"id = '{doc_id}'")
        self.model.pop(doc_id)
        self.record(f"foreign delete {doc_id}")

    def add_deleted_column(self) -> None:
        """The tombstone column, as schema version 3 has it (nullable boolean, last)."""
        from deltalake.schema import Field, PrimitiveType

        store = self.ob.store
        store.refresh()
        if DELETED not in pa.schema(store.delta_table.schema().to_arrow()).names:  # v3 has it
            field = Field(DELETED, PrimitiveType("boolean"), nullable=True)
            store.delta_table.alter.add_columns(field)
        self.has_deleted_column = True
        self.record("deleted column")

    def tombstone(self, doc_id: str) -> None:
        """A delete as the delete part writes it: the next version, same life, ``deleted``
        true, no state, the messages' numbering kept (appended by hand here)."""
        mine = self.model[doc_id]
        version = mine["version"] + 1
        row = _row(mine, version=version, state={}, deleted=True)
        self._append([{**row, "bucket": self.ob.store.bucket(doc_id)}])
        mine.update(version=version, state={}, deleted=True)
        self.record(f"tombstone {doc_id}")

    def recreate_over_tombstone(self, doc_id: str, state: dict[str, Any]) -> None:
        """A new life over a dispatched tombstone: the next version number, a new incarnation,
        its own messages from seq 1 (appended by hand here)."""
        mine = self.model[doc_id]
        assert mine[DELETED]
        new = _doc(doc_id, mine["type"], mine["version"] + 1, state, 1, life=new_incarnation())
        self._append([{**_row(new), "bucket": self.ob.store.bucket(doc_id)}])
        self.model[doc_id] = new
        self.record(f"re-create {doc_id} over its tombstone")

    def _append(self, rows: list[dict[str, Any]]) -> None:
        from deltalake import write_deltalake

        store = self.ob.store
        store.refresh()
        schema = pa.schema(store.delta_table.schema().to_arrow())
        full = [{**{f.name: None for f in schema}, "outbox": [], **r} for r in rows]
        write_deltalake(store.delta_table, pa.Table.from_pylist(full, schema=schema), mode="append")

    # --- the standard run ------------------------------------------------------------------

    def run(self, check: Callable[[str], None] | None = None) -> TableStates:
        """Every step of ``STEPS`` in order; ``check(step)`` after each (a reader of the table
        as it is now)."""
        for step in self.steps():
            if check is not None:
                check(step)
        return self

    def steps(self) -> Iterator[str]:
        for name, step in STEPS:
            step(self)
            yield name


def _doc(
    doc_id: str, type: str, version: int, state: dict[str, Any], last_seq: int, *, life: str | None
) -> Doc:
    return {
        "id": doc_id,
        "type": type,
        "version": version,
        "state": dict(state),
        "last_seq": last_seq,
        "dispatched_seq": 0,
        "incarnation": life,
        DELETED: False,
    }


def _row(doc: Doc, **changes: Any) -> dict[str, Any]:
    """A table row of a model document (``changes`` applied), for a hand append."""
    d = {**doc, **changes}
    return {
        "id": d["id"],
        "type": d["type"],
        "version": d["version"],
        "state": json.dumps(d["state"], separators=(",", ":"), sort_keys=True),
        "last_seq": d["last_seq"],
        "dispatched_seq": 0,
        "outbox": [],
        S.INCARNATION: d["incarnation"],
        DELETED: d[DELETED] or None,
    }


def _mark_row(doc_id: str, seq: int, life: str | None, bucket: int) -> dict[str, Any]:
    return {
        "id": doc_id,
        "type": "",
        "version": 0,
        "state": "",
        "last_seq": 0,
        "dispatched_seq": seq,
        "outbox": [],
        "bucket": bucket,
        S.INCARNATION: life,
    }


def _saves(t: TableStates) -> None:
    for doc_id, type in (("a", "Order"), ("b", "Order"), ("c", "Order"), ("d", "Invoice")):
        t.save(doc_id, {"n": 0}, type=type)
    t.save("e", {"n": 0}, type="Invoice", messages=2)


def _updates(t: TableStates) -> None:
    t.save("a", {"n": 1})
    t.save("a", {"n": 2})
    t.save("b", {"n": 1}, messages=2)


def _marks(t: TableStates) -> None:
    """a's newest version carries watermark 0 (what its save read); the mark rows hold more."""
    t.mark("a", 2, t.life("a"))
    t.mark("b", 1, t.life("b"))
    t.mark("d", 1, t.life("d"))
    t.mark("d", 2, "some other life")  # a mark of another life counts for nothing


def _after_fold(t: TableStates) -> None:
    t.save("a", {"n": 3})
    t.mark("a", 3, t.life("a"))
    t.save("c", {"n": 1})


def _legacy(t: TableStates) -> None:
    t.legacy("old", {"legacy": True}, last_seq=2)
    t.mark("old", 1, None)
    t.save("old", {"legacy": True, "n": 1})


def _foreign_delete(t: TableStates) -> None:
    life = t.life("b")
    t.foreign_delete("b")
    t.mark("b", 5, life)  # the dispatcher's late mark of the deleted life: a marks-only id


def _recreate(t: TableStates) -> None:
    t.save("b", {"again": True}, type="Order")  # a new life; the old life's mark row stays


def _tombstones(t: TableStates) -> None:
    t.add_deleted_column()
    t.tombstone("c")
    t.mark("c", t.model["c"]["last_seq"], t.life("c"))  # its last messages were sent
    t.tombstone("e")  # not dispatched yet


def _recreate_over_tombstone(t: TableStates) -> None:
    t.mark("e", t.model["e"]["last_seq"], t.life("e"))
    t.recreate_over_tombstone("e", {"back": True})


#: The standard run, in order: (name, step).
STEPS: list[tuple[str, Callable[[TableStates], None]]] = [
    ("saves", _saves),
    ("updates", _updates),
    ("unfolded marks", _marks),
    ("fold", TableStates.fold),
    ("saves and marks after the fold", _after_fold),
    ("compaction", TableStates.compact),
    ("legacy rows", _legacy),
    ("foreign delete and a late mark", _foreign_delete),
    ("re-create with a new life", _recreate),
    ("tombstones", _tombstones),
    ("re-create over a tombstone", _recreate_over_tombstone),
]

"""The readers of the current documents, each compared with the table's model at every version
(``testkit.table_states``). Plain functions, so the pytest tests and the source mutations
(tests/readers/test_reader_mutations.py) run the same checks; each assertion sits in the check
itself, the line a mutation must fail on.

The rule is called through its module (``current.current_sql``), never imported by name: a
mutation replaces the module's function, and every reader here must see the replacement.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from outbox.core.errors import HistoryGoneError
from outbox.delta import current, reads
from outbox.delta import schema as S
from testkit.table_states import DELETED, MODELLED, TableStates

TYPES = ("Order", "Invoice", "Legacy")


def as_model(table: pa.Table, *, include_deleted: bool = False) -> dict[str, dict[str, Any]]:
    """A reader's Arrow rows in the model's shape: the modelled columns, ``state`` parsed, by id
    (and the order checked: every reader returns its documents by id)."""
    keys = (*MODELLED, DELETED) if include_deleted else MODELLED
    rows = table.to_pylist()
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids), f"not ordered by id: {ids}"
    return {r["id"]: {k: json.loads(r[k]) if k == "state" else r[k] for k in keys} for r in rows}


def tombstones_at(t: TableStates, version: int) -> bool:
    """Whether the table has the ``deleted`` column at ``version``."""
    return S.has_deleted(pa.schema(_at(t, version).schema().to_arrow()))


def _at(t: TableStates, version: int) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(t.uri, version=version)


def check_all_documents(t: TableStates) -> None:
    """``ob.documents(as_of=v)``, every document (the window SQL), both views, every version."""
    for v in sorted(t.at):
        for deleted in (False, True):
            got = as_model(
                t.ob.documents(as_of=v, include_deleted=deleted), include_deleted=deleted
            )
            assert got == t.documents(v, include_deleted=deleted), (v, t.step_of[v], deleted)


def check_documents_by_id(t: TableStates) -> None:
    """``ob.documents(ids, as_of=v)`` (the rows of the ids folded in Arrow), every version; an
    id never written is simply absent."""
    ids = [*sorted(t.ids), "never-written"]
    for v in sorted(t.at):
        for deleted in (False, True):
            table = t.ob.documents(ids, as_of=v, include_deleted=deleted)
            got = as_model(table, include_deleted=deleted)
            assert got == t.documents(v, include_deleted=deleted), (v, t.step_of[v], deleted)


def check_documents_by_type(t: TableStates) -> None:
    """``ob.documents(type=...)`` filters on the document's newest row, both paths."""
    for v in sorted(t.at):
        want = t.documents(v)
        for kind in TYPES:
            typed = {i: d for i, d in want.items() if d["type"] == kind}
            assert as_model(t.ob.documents(type=kind, as_of=v)) == typed, (v, kind)
            by_id = t.ob.documents(sorted(t.ids), type=kind, as_of=v)
            assert as_model(by_id) == typed, (v, kind)


def commit_times(t: TableStates) -> dict[int, datetime]:
    """Each version's ``commitInfo.timestamp``, read from its commit file (not the resolver's
    walk of the history)."""
    out = {}
    for v in sorted(t.at):
        entry = Path(t.uri) / "_delta_log" / f"{v:020d}.json"
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info is not None:
                out[v] = datetime.fromtimestamp(info["timestamp"] / 1000, tz=UTC)
    return out


def check_documents_by_time(t: TableStates) -> None:
    """``as_of`` a version's commit time (a datetime, and as ISO text) reads that version. Only
    the versions before any two commits landed in one millisecond: after such a tie Delta's
    convention (the later counts as a millisecond later) moves the times, which is not this
    check's to restate."""
    times = commit_times(t)
    versions = sorted(times)
    tie = next(
        (v for v, w in itertools.pairwise(versions) if times[w] <= times[v]),
        versions[-1],
    )
    checked = [v for v in versions if v < tie]
    assert len(checked) >= 2  # the check checks something
    for v in checked:
        want = t.documents(v)
        assert as_model(t.ob.documents(as_of=times[v])) == want, (v, t.step_of[v])
        assert as_model(t.ob.documents(as_of=times[v].isoformat())) == want, (v, t.step_of[v])
    first = min(times.values())
    with pytest.raises(HistoryGoneError, match="the oldest readable version is 0"):
        t.ob.documents(as_of=first - timedelta(milliseconds=1))


def check_datafusion(t: TableStates) -> None:
    """A user's DataFusion query (deltalake's QueryBuilder) over ``current_sql``'s text."""
    from deltalake import QueryBuilder

    for v in sorted(t.at):
        sql = current.current_sql("documents", has_deleted=tombstones_at(t, v))
        reader = QueryBuilder().register("documents", _at(t, v)).execute(sql + " ORDER BY id")
        got = pa.RecordBatchReader.from_stream(reader).read_all()
        assert as_model(got) == t.documents(v), (v, t.step_of[v])


def check_polars(t: TableStates) -> None:
    """polars SQL over ``polars.scan_delta(uri, version=v)`` with ``current_sql``'s text (the
    other engine that reads Delta here)."""
    import polars as pl

    for v in sorted(t.at):
        sql = current.current_sql("documents", has_deleted=tombstones_at(t, v))
        frame = pl.SQLContext(documents=pl.scan_delta(t.uri, version=v)).execute(sql, eager=True)
        got = frame.sort("id").to_arrow()
        assert as_model(got) == t.documents(v), (v, t.step_of[v])


def check_arrow_equals_sql(t: TableStates) -> None:
    """The rule's two forms agree on every version's raw rows, both views, every column."""
    from deltalake import QueryBuilder

    for v in sorted(t.at):
        dt = _at(t, v)
        tombstones = tombstones_at(t, v)
        for deleted in (False, True):
            cols = current.output_columns(None, include_deleted=deleted)
            arrow = current.project(
                current.current_rows(
                    reads.plain_strings(dt.to_pyarrow_table()), include_deleted=deleted
                ),
                cols,
            )
            sql = current.current_sql("t", include_deleted=deleted, has_deleted=tombstones)
            reader = QueryBuilder().register("t", dt).execute(sql + " ORDER BY id")
            by_sql = pa.RecordBatchReader.from_stream(reader).read_all()
            assert _plain(arrow) == _plain(by_sql), (v, t.step_of[v], deleted)


def _plain(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()  # type: ignore[no-any-return]

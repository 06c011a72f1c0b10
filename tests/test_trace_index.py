"""The trace's commit index (``outbox.app.trace.index``): a document's history read from the
commits the index names gives the same answer as the change data feed read over the whole
history, on a table with saves, marks, a deletion, a fold, a compaction and a log trim; the
index catches up with what was committed since, and forgets what the log no longer keeps."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from outbox.app.facade import Outbox
from outbox.core.clock import ManualClock

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
QUEUE = "shipments"
DOCS = ("a", "b", "c")


def _open(ws: Path, **kw: Any) -> Outbox:
    """Marks written inline (``watermark_window = 0``): a unit of work's mark is committed when
    it returns, so no commit lands behind a test's back (a deferred one did, on a loaded run)."""
    options: dict[str, Any] = {"transport": "sql", "default_destination": QUEUE}
    return Outbox.open(
        ws, clock=ManualClock(T0), compact_every=0, watermark_window=0, **options, **kw
    )


def _history(ws: Path) -> None:
    """Three documents: created, changed twice; a fold and a compaction; then one deleted and
    one changed again with deferred dispatch (its message pending)."""
    from outbox.delta.compaction import compact
    from outbox.delta.fold import fold_table

    with _open(ws) as ob:
        for d in DOCS:
            with ob.unit_of_work() as uow:
                uow.create(d, type="Package").send("Created", {"d": d}, correlation_id=f"c-{d}")
        for n in range(2):
            for d in DOCS:
                with ob.unit_of_work() as uow:
                    doc = uow.get(d)
                    assert doc is not None
                    doc.state["n"] = n
                    doc.send("Changed", {"n": n})
        assert fold_table(ob.store, at=0.0).to_dict()
        compact(ob.store)
        with ob.unit_of_work() as uow:  # after the fold, which would remove a sent tombstone
            uow.delete("c")
    with _open(ws, dispatch="deferred") as ob, ob.unit_of_work() as uow:
        doc = uow.get("a")
        assert doc is not None
        doc.send("Later", {})


def _trace(ob: Outbox, doc_id: str, *, use_index: bool) -> dict[str, Any]:
    from outbox.app.trace import trace

    data: dict[str, Any] = trace(
        ob.settings, ManualClock(T0), doc_id, use_index=use_index
    ).to_dict()
    return data


def _index_rows(ob: Outbox) -> list[tuple[str, int]]:
    from migrations.sql.tables import commit_index as T
    from outbox.core.sql import make_engine

    engine = make_engine(ob.settings.sql_url)
    try:
        with engine.connect() as c:
            rows = c.execute(select(T.c.document_id, T.c.table_version)).all()
    finally:
        engine.dispose()
    return sorted((str(d), int(v)) for d, v in rows)


def test_the_indexed_history_is_the_feeds_history(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _history(ws)
    with _open(ws) as ob:
        for d in DOCS:
            indexed, fed = _trace(ob, d, use_index=True), _trace(ob, d, use_index=False)
            assert indexed == fed, d
        # the history holds what the comparison is about: the fold's deletes, the deletion,
        # the dispatcher's marks, the saves
        commits = [
            c for d in DOCS for c in _trace(ob, d, use_index=True)["documents"][0]["commits"]
        ]
        writers = {c["writer"] for c in commits}
        assert writers == {"outbox", "dispatcher", "fold"}
        changes = {c["change"] for c in _trace(ob, "c", use_index=True)["documents"][0]["commits"]}
        assert "delete" in changes


def test_a_folded_message_is_found_by_its_id_in_the_index_not_the_feed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the fold no current row carries a sent message: the index finds its document by
    the message id and by the correlation id, the same answer the feed's search gives, and the
    feed is not read."""
    from outbox.app.trace import timeline
    from outbox.core.errors import DocumentNotFoundError

    ws = tmp_path / "ws"
    _history(ws)
    with _open(ws) as ob:
        first = _trace(ob, "b", use_index=True)["documents"][0]["messages"][0]
        assert first["type"] == "Created"
        assert first["fate"] != "pending"  # sent, then folded away from the current row
        fed = {q: _trace(ob, q, use_index=False) for q in (first["message_id"], "c-b")}

        def no_feed(*args: Any) -> Any:
            raise AssertionError("the feed was read")

        monkeypatch.setattr(timeline, "in_feed", no_feed)
        for q, expected in fed.items():
            try:
                found = _trace(ob, q, use_index=True)
            except DocumentNotFoundError as e:
                pytest.fail(f"the index did not find {q}: {e}")
            assert found["matched_by"] == expected["matched_by"] != "document_id", q
            assert found == expected, q


def test_a_read_only_database_uses_the_index_another_trace_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only console's trace cannot write the index: it reads the feed while the index is
    behind, and the index once another trace has caught it up (its prune, a write, fails too)."""
    from outbox.app.trace import timeline
    from outbox.app.trace.index import CommitIndex
    from outbox.core.sql import read_only_url
    from outbox.wiring import Backends

    ws = tmp_path / "ws"
    _history(ws)
    with _open(ws) as ob:
        fed = _trace(ob, "a", use_index=False)
        reading = ob.settings.replace(sql_url=read_only_url(ob.settings.sql_url))

        def read_only(doc_id: str) -> dict[str, Any]:
            data: dict[str, Any] = timeline.trace(reading, ManualClock(T0), doc_id).to_dict()
            return data

        assert read_only("a") == fed  # behind (never built): the feed
        with Backends(ob.settings) as backends:  # and it could not build it
            index = CommitIndex(backends.sql_queue.database, ob.store.table_id)
            assert index.indexed_to() is None
        _trace(ob, "b", use_index=True)  # a console that may write catches it up

        def no_feed(*args: Any) -> Any:
            raise AssertionError("the feed was read")

        monkeypatch.setattr(timeline, "from_feed", no_feed)
        assert read_only("a") == fed


def test_the_index_catches_up_with_later_commits_and_forgets_trimmed_ones(tmp_path: Path) -> None:
    from outbox.app.trace.changes import Commits
    from outbox.app.trace.index import CommitIndex
    from outbox.wiring import Backends

    ws = tmp_path / "ws"
    _history(ws)
    with _open(ws) as ob:
        before = _trace(ob, "a", use_index=True)["documents"][0]["commits"]
        indexed = _index_rows(ob)
        with ob.unit_of_work() as uow:
            doc = uow.get("b")
            assert doc is not None
            doc.send("AfterTheIndex", {})
        latest = ob.store.refresh()
        after = _trace(ob, "b", use_index=True)
        assert after == _trace(ob, "b", use_index=False)
        assert after["documents"][0]["commits"][-1]["table_version"] == latest
        assert ("b", latest) in _index_rows(ob)
        assert _trace(ob, "a", use_index=True)["documents"][0]["commits"] == before
        # the log trimmed to ``oldest``: the index keeps nothing older
        oldest = latest - 3
        with Backends(ob.settings) as backends:
            index = CommitIndex(backends.sql_queue.database, ob.store.table_id)
            assert index.catch_up(Commits(ob.settings), oldest, latest, T0) == 0
            assert index.indexed_to() == latest
            kept = _index_rows(ob)
            index.clear()  # a rebuild gives the same rows
            assert index.indexed_to() is None
            assert index.catch_up(Commits(ob.settings), oldest, latest, T0) == latest - oldest + 1
            assert _index_rows(ob) == kept
    rows = _index_rows(ob)
    assert rows
    assert all(v >= oldest for _, v in rows)
    assert len(indexed) > len([r for r in rows if r[1] < latest])


def test_an_erased_documents_index_rows_go_with_it(tmp_path: Path) -> None:
    from outbox.app.erasure_sql import purge

    ws = tmp_path / "ws"
    _history(ws)
    with _open(ws) as ob:
        _trace(ob, "a", use_index=True)
        assert any(d == "b" for d, _ in _index_rows(ob))

        class Life:
            doc_id = "b"

            def message_ids(self, table_id: str) -> list[str]:
                return []

            def command_ids(self, table_id: str) -> list[str]:
                return []

        counts = purge(ob.settings.sql_url, ob.store.table_id, [Life()])  # type: ignore[list-item]
        assert counts["outbox_commit_index"] > 0
        assert counts["outbox_commit_index_messages"] > 0
        assert not any(d == "b" for d, _ in _index_rows(ob))

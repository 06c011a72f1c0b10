"""What happened to document X: its versions from the table's history, each message's fate, and
the ``ProcessDocument`` commands that touched it (``outbox trace ID``; issue 46, item 1).

Why one read-only module apart from ``status``: status counts over the whole table; a trace
follows one document through the three places its life is written down (the Delta log, the
SQL queue, the dead letters), and each of those reads already exists (``store.read``, the
change data feed, ``peek_session``, ``DeadLetterBrowser``, ``list_dead_letters``); this module
only joins them.

What it costs (so it stays bounded at 1,000,000 documents and a long history):

* **Finding.** A document id: one SQL read of its bucket (``_current``: ``store.read`` without
  the file id index, which a fresh store would first fill from the whole bucket). A message
  id or a correlation id is not a key of the table: the commit index finds it (one indexed SQL
  read of the messages of the retained history), else one DataFusion query over the current
  snapshot's rows (a pending message written before the retained history). Without the index,
  the snapshot first, and only when no row carries it the retained change data feed of the whole
  table, ids and messages only (``feed.in_feed``): a read of every retained commit and of its
  files (an id that names nothing pays it too before it is called unknown). ``since`` narrows
  the index's and the feed's search.
* **History.** The commit index (``index``, in the workspace's database) holds each change row
  of the document (its change type, versions, sequence numbers, the ids of its messages) and its
  messages; it is first caught up with the commits made since it was last read (their change
  files, once for every later trace). Then the trace reads the document's rows from it, and
  those commits' log entries (their time and writer): no data file. Without the index
  (``use_index=False``, or a database that cannot hold it) the document's change data feed over
  the retained history is read instead (``feed.from_feed``), whose cost follows the log's
  length: every commit file of the range.
* **Fates.** Per (destination, session) of its messages: one indexed peek of the session
  (``SESSION_LIMIT`` messages from its head) and one indexed page of its dead letters; for the
  command queue, the same for the session named by the document id. Only the SQL queue is
  looked in; other transports and command queues are named in ``notes``.

Commits older than the retained history (``log_retention``) are gone: the current row then
stands for them, and its pending messages still get a fate.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from outbox.app.trace.changes import Commits
from outbox.app.trace.fates import fates
from outbox.app.trace.feed import KEYS, feed_errors, from_feed, in_feed
from outbox.app.trace.index import CHUNK, CommitIndex
from outbox.app.trace.model import Commit, DocumentTrace, MessageFate, Trace
from outbox.core.clock import Clock, utc
from outbox.core.errors import (
    DocumentNotFoundError,
    HistoryGoneError,
    OutboxError,
    ValidationError,
)
from outbox.core.settings import Settings
from outbox.delta.change_files import committed_at

log = logging.getLogger("outbox.trace")

#: A correlation id may name many documents: at most this many are traced.
MAX_DOCUMENTS = 20
#: What ``commitInfo``'s ``outbox.operation`` says, as the writer a person recognizes.
_WRITERS = {"save": "outbox", "watermark": "dispatcher", "fold": "fold", "erase": "erase"}


def trace(
    settings: Settings,
    clock: Clock,
    query: str,
    *,
    since: int | None = None,
    use_index: bool = True,
) -> Trace:
    """Find the document(s) ``query`` names (a document id, a message id, a correlation id, in
    that order) and trace each. ``since``: the first table version read (default: the oldest
    retained commit). ``use_index``: read each history through the commit index (caught up
    first), else from the change data feed. Unknown: ``DocumentNotFoundError``."""
    from outbox.wiring.backends import open_document_store

    if not query or not query.strip():
        raise ValidationError(
            "trace needs an id", hint="give a document, message or correlation id"
        )
    store = open_document_store(settings)
    commits = Commits(settings)  # shared by the documents
    try:
        latest = store.refresh()
        oldest, first = _first_version(settings, since, latest, commits.fs)
        with _commit_index(settings, clock, store.table_id, use_index) as opened:
            index = None if opened is None else _caught_up(opened, clock, commits, oldest, latest)
            matched_by, rows = _find(store, query, first, latest, index)
            if not rows:
                raise DocumentNotFoundError(
                    f"no document, message or correlation id {query!r} in {settings.table_uri} "
                    f"(versions {first}..{latest} read)",
                    hint="check the id (`outbox sql` lists documents); a message sent and folded "
                    "before the retained history can no longer be found by its id",
                )
            docs = [
                _history(store, row, first=first, latest=latest, clock=clock, commits=commits,
                         index=index)
                for row in rows
            ]  # fmt: skip
    finally:
        store.close()
    fates(settings, clock, store.table_id, docs)
    return Trace(query=query, matched_by=matched_by, table_version=latest, documents=docs)


@contextmanager
def _commit_index(
    settings: Settings, clock: Clock, table_id: str, wanted: bool
) -> Iterator[CommitIndex | None]:
    """The table's commit index in the workspace's database; None (the feed is read instead)
    when not ``wanted`` or when the database cannot be opened (said in the log)."""
    from outbox.wiring import Backends

    if not wanted:
        yield None
        return
    try:
        backends = Backends(settings, clock=clock)
        database = backends.sql_queue.database
    except OutboxError as e:
        log.warning("the trace reads the change data feed: the commit index is unavailable (%s)", e)
        yield None
        return
    with backends:
        yield CommitIndex(database, table_id)


def _caught_up(
    index: CommitIndex, clock: Clock, commits: Commits, oldest: int, latest: int
) -> CommitIndex | None:
    """``index`` caught up to ``latest``; None (the feed is read instead) when that fails, unless
    it already was (a read-only database: another trace keeps it up to date; rows below
    ``oldest`` it could not prune are outside every read's range)."""
    try:
        done = index.catch_up(commits, oldest, latest, utc(clock.now()), _progress)
    except OutboxError as e:
        with contextlib.suppress(OutboxError):
            if (index.indexed_to() or -1) >= latest:
                return index
        log.warning("the trace reads the change data feed: the commit index failed (%s)", e)
        return None
    if done > CHUNK:
        log.info("the commit index read %d new commits", done)
    return index


def _progress(done: int, total: int) -> None:
    if total > CHUNK:
        log.info("indexing the table's commits for the trace: %d of %d", done, total)


# --- finding ------------------------------------------------------------------------------------


def _first_version(settings: Settings, since: int | None, latest: int, fs: Any) -> tuple[int, int]:
    """(the oldest retained commit, the first version the trace reads)."""
    from outbox.delta.log import oldest_retained

    oldest = oldest_retained(settings.table_uri, fs) or 0
    if since is None:
        return oldest, oldest
    if since < 0 or since > latest:
        raise ValidationError(
            f"--since {since} is not a version of the table (its newest is {latest})",
            hint=f"give a version from {oldest} to {latest}",
        )
    if since < oldest:
        raise HistoryGoneError(
            f"version {since} is before the retained history, which begins at version {oldest}",
            hint=f"trace from version {oldest} or later (log_retention sets how much is kept)",
        )
    return oldest, since


def _find(
    store: Any, query: str, first: int, latest: int, index: CommitIndex | None
) -> tuple[str, list[Any]]:
    """(how the query matched, the current rows of the documents it names): a document id,
    else a message id, else a correlation id. Both ids are looked for in the commit index (the
    retained history's messages), else in one pass over the snapshot (a message written before
    the retained history), and without the index in one pass over the retained feed."""
    found = _current(store, [query])
    if query in found:
        return "document_id", [found[query]]
    if index is not None:
        matches = index.find(query, first) or _in_snapshot(store, query)
    else:
        matches = _in_snapshot(store, query) or in_feed(store, query, first, latest)
    for key in KEYS:
        ids = sorted(matches.get(key, set()))[:MAX_DOCUMENTS]
        rows = _current(store, ids) if ids else {}
        if rows:
            return key, [rows[i] for i in sorted(rows)]
    return "document_id", []


def _current(store: Any, ids: list[str]) -> dict[str, Any]:
    """The current rows of ``ids``: ``store.read`` without its file id index, which a fresh
    store fills by reading every id of the bucket's files first (a writer's saves reuse it; a
    trace's one read would not: 42 against 15 ms at 1,000,000 documents)."""
    from outbox.delta import reads, versions
    from outbox.delta import schema as S
    from outbox.delta.store import SCAN_CHUNK

    scanned = reads.scan(store._query, ids, None, store.bucket, SCAN_CHUNK)
    rows = S.rows_from_table(versions.latest_rows(scanned, include_deleted=True))
    return {r.id: r for r in rows}


def _in_snapshot(store: Any, value: str) -> dict[str, set[str]]:
    """key -> the ids whose current rows carry a message with that key = ``value``."""
    from outbox.delta.reads import quote_ids

    v = quote_ids([value])
    sql = (
        f"SELECT DISTINCT id, m['message_id'] = {v} AS by_message FROM (SELECT id, "
        "unnest(outbox) AS m FROM t WHERE version > 0) AS u "
        f"WHERE m['message_id'] = {v} OR m['correlation_id'] = {v} "
        f"ORDER BY by_message DESC, id LIMIT {MAX_DOCUMENTS}"
    )
    t = store._query(sql)
    out: dict[str, set[str]] = {}
    for doc_id, by_message in zip(t["id"].to_pylist(), t["by_message"].to_pylist(), strict=True):
        out.setdefault(KEYS[0] if by_message else KEYS[1], set()).add(str(doc_id))
    return out


# --- the history ----------------------------------------------------------------------------------


def _history(
    store: Any,
    row: Any,
    *,
    first: int,
    latest: int,
    clock: Clock,
    commits: Commits,
    index: CommitIndex | None,
) -> DocumentTrace:
    """The document's rows from the commit ``index`` (None: from the feed), with each commit's
    log entry (its time and writer)."""
    from outbox.delta.schema import message_to_struct

    doc = DocumentTrace(
        id=row.id,
        type=row.type,
        incarnation=row.incarnation,
        version=row.version,
        deleted=row.deleted,
        last_seq=row.last_seq,
        dispatched_seq=row.dispatched_seq,
        history_from=first,
    )
    outbox_at: Callable[[int], list[dict[str, Any]]] | None = None
    if index is not None:
        rows = index.rows(row.id, first, latest)
        with feed_errors():
            commits.load({int(r["_commit_version"]) for r in rows})
        for r in rows:  # when it was committed: the log entry's time, as the feed gives it
            r["_commit_timestamp"] = committed_at(commits.info(r["_commit_version"]))
    else:
        rows, outbox_at = from_feed(store, row.id, first, latest)
    rows = [r for r in rows if r["_change_type"] != "update_preimage"]
    rows.sort(key=lambda r: (int(r["_commit_version"]), int(r["version"])))
    seen: dict[str, MessageFate] = {}
    for r in rows:
        table_version = int(r["_commit_version"])
        writer, operation = writer_of(commits.info(table_version))
        if int(r["version"]) == 0 and writer == "outbox":
            writer = "dispatcher"  # a mark carried by a save's append (design.md, section 7)
        added: list[str] = []
        if r["_change_type"] != "delete" and int(r["version"]) > 0:
            written = r.get("outbox") if outbox_at is None else outbox_at(table_version)
            for m in written or []:
                if m["message_id"] not in seen:
                    seen[m["message_id"]] = _fate_of(m, row.id, table_version)
                    added.append(m["message_id"])
        doc.commits.append(
            Commit(
                table_version=table_version,
                committed_at=_utc(r["_commit_timestamp"]),
                writer=writer,
                operation=operation,
                change=str(r["_change_type"]),
                document_version=int(r["version"]),
                last_seq=int(r["last_seq"]),
                dispatched_seq=int(r["dispatched_seq"]),
                added=added,
            )
        )
    for m in row.outbox:  # pending messages written before the retained history
        if m.message_id not in seen:
            seen[m.message_id] = _fate_of(message_to_struct(m), row.id, None)
    now = utc(clock.now())
    pending = {m.message_id for m in row.pending()}  # the versions rule, as every reader reads it
    for fate in seen.values():
        fate.pending = fate.message_id in pending
        fate.fate = "pending" if fate.pending else "accepted"
        if fate.pending and fate.created_at is not None:
            fate.pending_age_s = round(max(0.0, (now - fate.created_at).total_seconds()), 3)
    doc.messages = sorted(seen.values(), key=lambda f: (f.first_table_version or -1, f.seq))
    return doc


def writer_of(info: dict[str, Any]) -> tuple[str, str]:
    """(who wrote a commit, what it did) from its ``commitInfo``: the framework names its own
    commits (``outbox.operation``); Spark names itself in ``engineInfo``; anything else is a
    foreign writer."""
    operation = str(info.get("operation") or "?")
    ours = info.get("outbox.operation")
    if ours:
        return _WRITERS.get(str(ours), str(ours)), f"{operation} ({ours})"
    engine = str(info.get("engineInfo") or "")
    if "spark" in engine.lower():
        return "spark", operation
    return "foreign", f"{operation} ({engine or 'unknown engine'})"


def _fate_of(m: dict[str, Any], doc_id: str, table_version: int | None) -> MessageFate:
    from dispatcher.keys import key_of
    from outbox.delta.schema import message_from_struct

    return MessageFate(
        seq=int(m["seq"]),
        message_id=str(m["message_id"]),
        destination=str(m["destination"]),
        type=str(m["type"]),
        # the session it was sent in (the index keeps it)
        session_id=m.get("session_id") or key_of(message_from_struct(m), doc_id)[1],
        correlation_id=m.get("correlation_id"),
        created_at=_utc(m.get("created_at")),
        first_table_version=table_version,
    )


def _utc(value: Any) -> datetime | None:
    return utc(value) if isinstance(value, datetime) else None

"""What happened to document X: its versions from the table's history, each message's fate, and
the ``ProcessDocument`` commands that touched it (``outbox trace ID``; issue 46, item 1).

Why one read-only module apart from ``status``: status counts over the whole table; a trace
follows one document through the three places its life is written down (the Delta log, the
SQL queue, the dead letters), and each of those reads already exists (``store.read``, the
change data feed, ``peek_session``, ``DeadLetterBrowser``, ``list_dead_letters``); this module
only joins them.

What it costs (so it stays bounded at 1,000,000 documents):

* **Finding.** A document id: the store's pruned read of its bucket (``store.read``). A message
  id or a correlation id is not a key of anything: first one DataFusion query over the current
  snapshot's rows (after a fold, one row per document: a scan of every live row's ``outbox``),
  and only when no row carries it (its message was sent and folded away) the retained change
  data feed of the whole table, ids and messages only: the one costly step, a read of every
  retained commit and of its files (an id that names nothing pays it too before it is called
  unknown). ``since`` narrows both feed reads. Tried on a two-core machine busy with a CI run,
  not a benchmark: with 2,000 commits the document's feed read took about a quarter of a second
  (a tenth of that from 100 commits back), so 10,000 commits is over the issue's goal; an index
  of the commits per document would be the fix.
* **History.** One change-data-feed read of the retained commits (``since`` on), predicate
  ``bucket = b AND id = X``: delta-rs prunes the data and change files to the document's
  bucket, but still reads every commit file of the range (the log). On a long history (10,000
  commits) the cost follows the log's length, not the table's size. Then one commit file per
  row of the document (its ``commitInfo``: who wrote it).
* **Fates.** Per (destination, session) of its messages: one indexed peek of the session
  (``SESSION_LIMIT`` messages from its head) and one indexed page of its dead letters; for the
  command queue, the same for the session named by the document id. Only the SQL queue is
  looked in; other transports and command queues are named in ``notes``.

Commits older than the retained history (``log_retention``) are gone: the current row then
stands for them, and its pending messages still get a fate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.app.trace.fates import fates
from outbox.app.trace.model import Commit, DocumentTrace, MessageFate, Trace
from outbox.core.clock import Clock, utc
from outbox.core.errors import (
    DocumentNotFoundError,
    HistoryGoneError,
    OutboxError,
    ValidationError,
)
from outbox.core.settings import Settings

#: A correlation id may name many documents: at most this many are traced.
MAX_DOCUMENTS = 20
#: The message fields an id is looked for in, in the order a match counts.
_KEYS = ("message_id", "correlation_id")
#: The feed's columns for a document's history.
_HISTORY_COLUMNS = [
    "id",
    "version",
    "last_seq",
    "dispatched_seq",
    "outbox",
    "incarnation",
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
]
#: What ``commitInfo``'s ``outbox.operation`` says, as the writer a person recognizes.
_WRITERS = {"save": "outbox", "watermark": "dispatcher", "fold": "fold", "erase": "erase"}


def trace(settings: Settings, clock: Clock, query: str, *, since: int | None = None) -> Trace:
    """Find the document(s) ``query`` names (a document id, a message id, a correlation id, in
    that order) and trace each. ``since``: the first table version read (default: the oldest
    retained commit). Unknown: ``DocumentNotFoundError``."""
    from outbox.wiring.backends import open_document_store

    if not query or not query.strip():
        raise ValidationError(
            "trace needs an id", hint="give a document, message or correlation id"
        )
    store = open_document_store(settings)
    try:
        latest = store.refresh()
        first = _first_version(settings, since, latest)
        matched_by, rows = _find(store, query, first, latest)
        if not rows:
            raise DocumentNotFoundError(
                f"no document, message or correlation id {query!r} in {settings.table_uri} "
                f"(versions {first}..{latest} read)",
                hint="check the id (`outbox sql` lists documents); a message sent and folded "
                "before the retained history can no longer be found by its id",
            )
        infos = _CommitInfos(settings)  # shared by the documents
        docs = [
            _history(store, settings, row, first=first, latest=latest, clock=clock, infos=infos)
            for row in rows
        ]
    finally:
        store.close()
    fates(settings, clock, store.table_id, docs)
    return Trace(query=query, matched_by=matched_by, table_version=latest, documents=docs)


# --- finding ------------------------------------------------------------------------------------


def _first_version(settings: Settings, since: int | None, latest: int) -> int:
    from outbox.delta.log import list_log, oldest_commit

    oldest = oldest_commit(list_log(settings.table_uri, settings.storage_options)) or 0
    if since is None:
        return oldest
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
    return since


def _find(store: Any, query: str, first: int, latest: int) -> tuple[str, list[Any]]:
    """(how the query matched, the current rows of the documents it names): a document id,
    else a message id, else a correlation id. Both ids are looked for in one pass over the
    snapshot, and (only when it holds neither) in one pass over the retained feed."""
    _, found = store.read([query])
    if query in found:
        return "document_id", [found[query]]
    matches = _in_snapshot(store, query) or _in_feed(store, query, first, latest)
    for key in _KEYS:
        ids = sorted(matches.get(key, set()))[:MAX_DOCUMENTS]
        _, rows = store.read(ids) if ids else (None, {})
        if rows:
            return key, [rows[i] for i in sorted(rows)]
    return "document_id", []


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
        out.setdefault(_KEYS[0] if by_message else _KEYS[1], set()).add(str(doc_id))
    return out


def _in_feed(store: Any, value: str, first: int, latest: int) -> dict[str, set[str]]:
    """``_in_snapshot`` over the rows the retained history wrote (the costly step: the module
    docstring says when it runs)."""
    from outbox.delta.reads import plain_strings

    out: dict[str, set[str]] = {}
    with _feed_errors(searching=value):
        reader = store.delta_table.load_cdf(
            starting_version=first, ending_version=latest, columns=["id", "outbox"]
        )
        for batch in pa.RecordBatchReader.from_stream(reader):
            part = plain_strings(pa.Table.from_batches([batch]))
            outbox = part["outbox"].combine_chunks()
            flat = pc.list_flatten(outbox)
            if len(flat) == 0:
                continue
            parents = pc.list_parent_indices(outbox)
            for key in _KEYS:
                hit = pc.equal(pc.cast(flat.field(key), pa.string()), value)
                ids = part["id"].take(parents.filter(hit)).to_pylist()
                out.setdefault(key, set()).update(str(i) for i in ids)
    return {k: v for k, v in out.items() if v}


@contextmanager
def _feed_errors(searching: str | None = None) -> Iterator[None]:
    from deltalake.exceptions import DeltaError

    from rescuer.cdf_local import history_gone

    try:
        yield
    except (DeltaError, OSError, pa.ArrowException) as e:
        text = (str(e).splitlines() or [""])[0]
        if searching is not None and spark_written(e):
            raise OutboxError(
                f"{searching!r} is no current message's id or correlation id, and the change "
                "data feed cannot be searched for earlier ones: Spark wrote some of its files, "
                "which deltalake's feed reader refuses to read messages from",
                hint="trace the document by its id (outbox trace DOCUMENT_ID)",
            ) from e
        if history_gone(e):
            raise HistoryGoneError(
                f"the change data feed the trace reads is gone ({text})",
                hint="trace from a newer version (--since)",
            ) from e
        raise OutboxError(f"reading the change data feed failed: {text}") from e


# --- the history ----------------------------------------------------------------------------------


def _history(
    store: Any,
    settings: Settings,
    row: Any,
    *,
    first: int,
    latest: int,
    clock: Clock,
    infos: _CommitInfos,
) -> DocumentTrace:
    from outbox.delta.reads import plain_strings, quote_ids
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
    by_id = f"id = {quote_ids([row.id])}"

    def read_feed(columns: list[str], predicate: str) -> pa.Table:
        reader = store.delta_table.load_cdf(
            starting_version=first, ending_version=latest, columns=columns, predicate=predicate
        )
        return plain_strings(pa.RecordBatchReader.from_stream(reader).read_all())

    outbox_at: Callable[[int], list[dict[str, Any]]] | None = None
    with _feed_errors():
        try:
            feed = read_feed(_HISTORY_COLUMNS, f"bucket = {store.bucket(row.id)} AND {by_id}")
        except Exception as e:
            if not spark_written(e):
                raise
            # The messages of each version from a snapshot at its commit instead of the feed,
            # and no partition filter (with one, the reader casts every column of the files).
            feed = read_feed([c for c in _HISTORY_COLUMNS if c != "outbox"], by_id)
            outbox_at = functools.partial(_outbox_at, store, row.id)
    feed = feed.filter(pc.not_equal(feed["_change_type"], "update_preimage"))
    order = [("_commit_version", "ascending"), ("version", "ascending")]
    seen: dict[str, MessageFate] = {}
    for r in feed.sort_by(order).to_pylist():
        table_version = int(r["_commit_version"])
        writer, operation = writer_of(infos(table_version))
        if int(r["version"]) == 0 and writer == "outbox":
            writer = "dispatcher"  # a mark carried by a save's append (design.md, section 7)
        added: list[str] = []
        if r["_change_type"] != "delete" and int(r["version"]) > 0:
            written = r["outbox"] if outbox_at is None else outbox_at(table_version)
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


def spark_written(error: BaseException) -> bool:
    """Whether a change-data-feed read failed on files Spark wrote: deltalake 1.6's feed reader
    refuses to cast their ``outbox`` structs, whose fields Spark writes nullable, to the table's
    non-null fields ("Cannot cast nullable struct field 'seq' to non-nullable field"); the
    snapshot reads of the same files work (docs/trace.md, "Surprises")."""
    return "Cannot cast nullable struct field" in str(error)


def _outbox_at(store: Any, doc_id: str, table_version: int) -> list[dict[str, Any]]:
    """The messages the document's row held as of ``table_version`` (the version that commit
    wrote), from a snapshot read at that version."""
    from outbox.delta.reads import read_store

    rows = read_store(
        store, [doc_id], as_of=table_version, columns=["outbox"], include_deleted=True
    ).to_pylist()
    return list(rows[0]["outbox"] or []) if rows else []


class _CommitInfos:
    """Each commit's ``commitInfo``, read once per trace through one filesystem handle: a
    handle is a new object-store client, which cost as much as the read (a trace of a document
    with a hundred versions opened two hundred)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._fs: Any = None
        self._read: dict[int, dict[str, Any]] = {}

    def __call__(self, version: int) -> dict[str, Any]:
        from outbox.delta.log import _filesystem, commit_actions, commit_info

        if version not in self._read:
            uri, options = self._settings.table_uri, self._settings.storage_options
            if self._fs is None:
                self._fs = _filesystem(uri, options or {})
            self._read[version] = commit_info(commit_actions(uri, version, self._fs))
        return self._read[version]


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
        session_id=key_of(message_from_struct(m), doc_id)[1],  # the session it was sent in
        correlation_id=m.get("correlation_id"),
        created_at=_utc(m.get("created_at")),
        first_table_version=table_version,
    )


def _utc(value: Any) -> datetime | None:
    return utc(value) if isinstance(value, datetime) else None

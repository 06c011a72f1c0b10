"""The change data feed of a range, as the messages its document rows carry: what ``outbox
replay`` plans from (``outbox.app.replay_plan``) and what its chunks are sent from
(``dispatcher.replay_handler``). One reading for both, so the planner and the worker agree on
which rows hold a message and which appearance of it counts. The worker's side too: the chunks
received together read at once (``spans``, ``chunk_rows``), their rows as the transport's messages
(``transport_messages``), and those packed into sends (``batches``, ``packed``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dispatcher.transports.base import TransportMessage
from outbox.delta.reads import plain_strings

#: The header every replayed message carries: the replay's id.
REPLAY_HEADER = "outbox-replay"
#: The change types that carry a row as written (a fold's deletes and the pre-images do not).
_IMAGES = ("insert", "update_postimage")
#: The columns the feed is read with: the planner's and the handler's.
FEED_COLUMNS = [
    "id",
    "version",
    "bucket",
    "incarnation",
    "outbox",
    "_change_type",
    "_commit_version",
]


def read_feed(
    delta_table: Any,
    start: int,
    end: int,
    *,
    predicate: str | None,
    full: bool,
    buckets: Collection[int] | None = None,
) -> pa.Table:
    """The messages the document rows committed in versions ``start..end`` carry, one row each:
    ``_commit_version, bucket, id, incarnation, seq, message_id, destination, type`` and, with
    ``full``, ``message`` (the stored struct, body included). Only images of document rows (an
    insert or an update's post-image, version above 0); a message a later version (or a fold,
    or a Spark MERGE) repeats is in it once per row: ``first_appearances`` keeps one.
    ``predicate``: SQL over the document columns; ``buckets``: only those partitions.

    Read batch by batch, so the planner holds the small columns of a big range, not its bodies.
    A range Spark wrote to, which deltalake's feed reader refuses, is read from its files
    (``outbox.delta.change_files``), without a ``predicate``. Driver errors pass through: the
    caller knows what they mean to it."""
    from outbox.delta.change_files import spark_written

    where = predicate
    if buckets is not None:
        within = f"bucket IN ({', '.join(str(b) for b in sorted(buckets)) or 'NULL'})"
        where = within if predicate is None else f"({predicate}) AND {within}"
    try:
        reader = delta_table.load_cdf(
            starting_version=start, ending_version=end, columns=FEED_COLUMNS, predicate=where
        )
        parts = [_explode(b, full) for b in pa.RecordBatchReader.from_stream(reader)]
    except Exception as e:
        if not spark_written(e):
            raise
        parts = _from_files(
            delta_table, start, end, predicate=predicate, full=full, buckets=buckets
        )
    parts = [p for p in parts if p.num_rows]
    return pa.concat_tables(parts) if parts else _explode(None, full)


def _from_files(
    delta_table: Any,
    start: int,
    end: int,
    *,
    predicate: str | None,
    full: bool,
    buckets: Collection[int] | None,
) -> list[pa.Table]:
    """``read_feed``'s rows read from the range's files, each cast to the table's types."""
    from outbox.core.errors import ValidationError
    from outbox.delta.change_files import range_rows
    from outbox.delta.schema import DOCUMENT_SCHEMA

    if predicate is not None:
        raise ValidationError(
            f"--where {predicate!r} cannot be applied to versions {start}..{end}: Spark wrote "
            "some of their files, which deltalake's change data feed reader refuses to read",
            hint="replay the range without --where (--destination still narrows it)",
        )
    uri = str(delta_table.table_uri)
    options = getattr(delta_table, "_storage_options", None)
    outbox_type = DOCUMENT_SCHEMA.field("outbox").type
    parts = []
    for part in range_rows(uri, options, start, end, FEED_COLUMNS, buckets=buckets):
        if "outbox" not in part.column_names:
            continue
        at = part.column_names.index("outbox")
        parts.append(
            _explode(part.set_column(at, "outbox", part["outbox"].cast(outbox_type)), full)
        )
    return parts


def _explode(batch: pa.RecordBatch | pa.Table | None, full: bool) -> pa.Table:
    columns = ["_commit_version", "bucket", "id", "incarnation", "seq", "message_id"]
    columns += ["destination", "type"] + (["message"] if full else [])
    if batch is None or batch.num_rows == 0:
        return _empty(columns)
    t = plain_strings(batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch]))
    keep = pc.and_(
        pc.is_in(t["_change_type"], value_set=pa.array(_IMAGES)),
        pc.greater(pc.cast(t["version"], pa.int64()), 0),
    )
    t = t.filter(keep)
    if t.num_rows == 0:
        return _empty(columns)
    outbox = t["outbox"].combine_chunks()
    flat = pc.list_flatten(outbox)
    if len(flat) == 0:
        return _empty(columns)
    parents = pc.list_parent_indices(outbox)
    out: dict[str, Any] = {
        "_commit_version": pc.cast(t["_commit_version"].take(parents), pa.int64()),
        "bucket": pc.cast(t["bucket"].take(parents), pa.int64()),
        "id": t["id"].take(parents),
        "incarnation": pc.cast(t["incarnation"].take(parents), pa.string()),
        "seq": pc.cast(flat.field("seq"), pa.int64()),
        "message_id": flat.field("message_id"),
        "destination": flat.field("destination"),
        "type": flat.field("type"),
    }
    if full:
        out["message"] = flat
    return pa.table(out)


def _empty(columns: list[str]) -> pa.Table:
    from outbox.delta.schema import MESSAGE_TYPE

    types = {"_commit_version": pa.int64(), "bucket": pa.int64(), "seq": pa.int64()}
    types["message"] = MESSAGE_TYPE
    return pa.table({c: pa.array([], types.get(c, pa.string())) for c in columns})


def first_appearances(messages: pa.Table) -> pa.Table:
    """Each message id once, at the first commit that wrote it, ordered by (commit, document,
    seq): the order a replay sends them in, which keeps each document's messages in seq order
    (a document's seq k+1 is never first written before its seq k)."""
    if messages.num_rows == 0:
        return messages
    order = [("_commit_version", "ascending"), ("id", "ascending"), ("seq", "ascending")]
    ordered = messages.sort_by(order)
    ordered = ordered.append_column("_row", pa.array(range(ordered.num_rows), pa.int64()))
    firsts = ordered.group_by("message_id", use_threads=False).aggregate([("_row", "min")])
    keep = pc.sort_indices(firsts["_row_min"])
    return ordered.take(pc.take(firsts["_row_min"], keep)).drop_columns(["_row"])


# --- the worker's reading: several chunks at once ------------------------------------------------


def spans(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Version ranges merged where they overlap or touch, in order: one feed read each. The
    chunks a worker receives together are of different buckets (one per session) and mostly of
    the same commits (the planner numbers them round-robin over the buckets), so one read serves
    them all; ranges far apart (two replays) stay apart, so no read covers what none needs."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def chunk_rows(
    feed: pa.Table, bucket: int, start: int, end: int, message_ids: Sequence[str]
) -> tuple[pa.Table, list[str]]:
    """The rows of ``message_ids``, in that order, among ``feed``'s rows of ``bucket`` written
    in versions ``start..end``, and the ids not found there. ``feed`` sorted by commit: each is
    taken at its first appearance in the range, as the planner counted it (a later row repeating
    a message carries the same message)."""
    versions = feed["_commit_version"]
    keep = pc.and_(
        pc.equal(feed["bucket"], bucket),
        pc.and_(pc.greater_equal(versions, start), pc.less_equal(versions, end)),
    )
    part = feed.filter(keep)
    wanted = pa.array(message_ids, pa.string())
    at = pc.index_in(wanted, value_set=part["message_id"])  # the first match of each
    if at.null_count:
        return part.slice(0, 0), wanted.filter(pc.is_null(at)).to_pylist()
    return part.take(at), []


def replayed_id(replay_id: str, message_id: str) -> str:
    """A replayed message's id under ``--new-ids``: ``sha256(replay|message_id)`` cut to 32 hex
    characters like ``message_id_for``'s, so every retry of the replay sends the same new id."""
    return hashlib.sha256(f"{replay_id}|{message_id}".encode()).hexdigest()[:32]


def transport_messages(found: pa.Table, replay: str, new_ids: bool) -> list[TransportMessage]:
    """The chunk's rows as the transport's messages. Read a column at a time (no dict per
    message), bodies as bytes by a cast, and each distinct headers text parsed once: its dict,
    with the replay's header, is shared by the messages that carry it, as the dispatcher shares
    a stored message's (transports only read them: ``transports.base``)."""
    if found.num_rows == 0:
        return []
    m = found["message"].combine_chunks()

    def column(name: str) -> list[Any]:
        return list(pc.struct_field(m, name).to_pylist())

    bodies = pc.cast(pc.struct_field(m, "body"), pa.binary()).to_pylist()
    shared: dict[str | None, dict[str, str]] = {}
    out: list[TransportMessage] = []
    rows = zip(
        found["id"].to_pylist(),
        column("message_id"),
        column("destination"),
        bodies,
        column("type"),
        column("content_type"),
        column("headers"),
        column("ordering_key"),
        column("correlation_id"),
        column("deliver_at"),
        strict=True,
    )
    for doc_id, original, destination, body, subject, content_type, raw, key, corr, at in rows:
        headers = shared.get(raw)
        if headers is None:
            headers = json.loads(raw) if raw else {}
            headers[REPLAY_HEADER] = replay
            shared[raw] = headers
        out.append(
            TransportMessage(
                message_id=replayed_id(replay, original) if new_ids else original,
                destination=destination,
                body=body,
                subject=subject,
                content_type=content_type or "application/json",
                session_id=key or doc_id,
                scheduled_at=at,
                correlation_id=corr,
                headers=headers,
            )
        )
    return out


# --- the sends ----------------------------------------------------------------------------------


def batches(
    messages: list[TransportMessage], most: int, coalesce: bool
) -> Iterable[list[TransportMessage]]:
    """Sends of at most ``most`` messages; without coalescing, one session's run per send (as
    the dispatcher sends one document per send to such a transport)."""
    part: list[TransportMessage] = []
    for m in messages:
        if part and (len(part) >= most or (not coalesce and m.session_id != part[0].session_id)):
            yield part
            part = []
        part.append(m)
    if part:
        yield part


def packed(
    chunks: list[list[TransportMessage]], most: int, coalesce: bool
) -> list[tuple[list[TransportMessage], int]]:
    """The sends of the chunks' messages, in order: each with how many chunks are wholly sent
    once it is (a chunk of no message is finished by the send before it, or by an empty one)."""
    sends: list[tuple[list[TransportMessage], int]] = []
    part: list[TransportMessage] = []
    for i, messages in enumerate(chunks):
        for m in messages:
            if part and (
                len(part) >= most or (not coalesce and m.session_id != part[0].session_id)
            ):
                sends.append((part, i))  # chunks before i are wholly in the sends so far
                part = []
            part.append(m)
    sends.append((part, len(chunks)))
    return sends

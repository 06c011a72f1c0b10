"""A document's history from the change data feed, and the search of the feed for a message or
correlation id: the trace's reads when the commit index is not used (``timeline``), and the
search, which no index serves (ids of messages are not indexed).

The feed's cost follows the length of the range (every commit file of it is read), and
deltalake 1.6's feed reader refuses delta-spark's files when it reads the ``outbox`` column or
filters by partition: both are handled here (docs/trace.md, "Tables Spark wrote to").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from outbox.core.errors import HistoryGoneError, OutboxError
from outbox.delta.change_files import spark_written

#: The message fields an id is looked for in, in the order a match counts.
KEYS = ("message_id", "correlation_id")
#: The feed's columns for a document's history.
HISTORY_COLUMNS = [
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


def in_feed(store: Any, value: str, first: int, latest: int) -> dict[str, set[str]]:
    """key -> the ids of the documents whose rows in the retained history carry a message with
    that key = ``value``: the timeline's snapshot search over the feed (the costly step:
    ``timeline``'s docstring says when it runs)."""
    from outbox.delta.reads import plain_strings

    out: dict[str, set[str]] = {}
    with feed_errors(searching=value):
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
            for key in KEYS:
                hit = pc.equal(pc.cast(flat.field(key), pa.string()), value)
                ids = part["id"].take(parents.filter(hit)).to_pylist()
                out.setdefault(key, set()).update(str(i) for i in ids)
    return {k: v for k, v in out.items() if v}


@contextmanager
def feed_errors(searching: str | None = None) -> Iterator[None]:
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


def from_feed(
    store: Any, doc_id: str, first: int, latest: int
) -> tuple[list[dict[str, Any]], Callable[[int], list[dict[str, Any]]] | None]:
    """The document's feed rows over ``first..latest`` (every commit file of the range read),
    and, when Spark wrote some of its files, where each version's messages come from instead."""
    from outbox.delta.reads import plain_strings, quote_ids

    by_id = f"id = {quote_ids([doc_id])}"

    def read_feed(columns: list[str], predicate: str) -> list[dict[str, Any]]:
        reader = store.delta_table.load_cdf(
            starting_version=first, ending_version=latest, columns=columns, predicate=predicate
        )
        table = pa.RecordBatchReader.from_stream(reader).read_all()
        return list(plain_strings(table).to_pylist())

    with feed_errors():
        try:
            return read_feed(HISTORY_COLUMNS, f"bucket = {store.bucket(doc_id)} AND {by_id}"), None
        except Exception as e:
            if not spark_written(e):
                raise
            # The messages of each version from a snapshot at its commit instead of the feed,
            # and no partition filter (with one, the reader casts every column of the files).
            rows = read_feed([c for c in HISTORY_COLUMNS if c != "outbox"], by_id)
            return rows, functools.partial(_outbox_at, store, doc_id)


def _outbox_at(store: Any, doc_id: str, table_version: int) -> list[dict[str, Any]]:
    """The messages the document's row held as of ``table_version`` (the version that commit
    wrote), from a snapshot read at that version."""
    from outbox.delta.reads import read_store

    rows = read_store(
        store, [doc_id], as_of=table_version, columns=["outbox"], include_deleted=True
    ).to_pylist()
    return list(rows[0]["outbox"] or []) if rows else []

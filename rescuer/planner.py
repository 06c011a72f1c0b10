"""Engine-independent rescue plans: what a pass found, whichever engine read the table.

Both engines (``cdf_local`` on delta-rs, ``cdf_spark`` on Spark) return a ``Plan``; the contract
suite compares them field by field, so "same meaning on two engines" is checked, not hoped for.

How a feed plan is computed (both engines do exactly this; the versions layout,
``outbox.delta.versions``, is why it is more than "the latest image per id"):

1. Read the change feed over ``(start, latest]``: the window ``(start, end]`` plus the *tail*
   ``(end, latest]`` that is younger than the delay.
2. Drop ``update_preimage`` rows. Per id, the document the images show is:

   - its *life*: the incarnation of its newest *document image* (by commit, then version) -- a
     re-created document's new life wins over the old; a mark row (``version`` 0) is no document
     image, since a late mark of a deleted life names that life;
   - its *newest version* of that life (by version, then commit): its ``last_seq`` is the
     document's, because saves append versions and a later commit may hold an older version's
     row (a fold raising its watermark);
   - its *watermark*: the highest ``dispatched_seq`` over that life's images, mark rows included;
   - *deleted* when a delete of that newest version (or a later one) came in a later commit: a
     fold's deletes of superseded versions and mark rows end nothing, and a commit that deletes
     and inserts a row rewrote it (``outbox maintain --repair``, an overwrite with a predicate).
3. A candidate is an id whose document *inside the window* is not deleted and is pending
   (``last_seq > dispatched_seq``).
4. The candidate is re-checked against its *current* document: the same rule over the whole
   ``(start, latest]`` range, which is the document as of ``latest`` (if the id changed after the
   window, the tail holds it; otherwise the window's images are still current). This is the same
   answer as ``store.read(ids)`` at version ``latest``, but costs a feed read of the recent tail
   instead of a scan of the table, so the pass stays flat as the table grows (see
   docs/rescuer.md). A candidate dispatched (or deleted) after the window drops out; one that
   received more messages is enqueued with its current ``last_seq``.
5. The command carries the current document's ``incarnation`` (null for a legacy row): a
   document deleted and created again is a new incarnation, so its command id is not its
   predecessor's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from outbox.core.errors import EngineError, FeedUnavailableError, OutboxError
from outbox.delta.log_check import damaged_log_error

Mode = Literal["feed", "sweep"]

#: Columns the planning needs from the feed (never the large ``state`` or ``outbox``).
FEED_COLUMNS = [
    "id",
    "version",
    "last_seq",
    "dispatched_seq",
    "incarnation",
    "_change_type",
    "_commit_version",
]


@dataclass(frozen=True, slots=True, order=True)
class PendingDocument:
    """A document to rescue, as of its current row."""

    id: str
    last_seq: int
    dispatched_seq: int
    incarnation: str | None = None  # None: a row written before incarnations existed

    def ref(self) -> tuple[str, int, str | None]:
        """(id, last_seq, incarnation): what a ``ProcessDocument`` command is derived from."""
        return (self.id, self.last_seq, self.incarnation)


@dataclass(frozen=True, slots=True)
class FeedWindow:
    """The versions a feed plan reads: the window ``(start, end]`` and the tail up to ``latest``."""

    start: int  # exclusive: the checkpoint
    end: int  # inclusive: the newest version older than the delay
    latest: int  # inclusive: the table version when the pass started


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pass would enqueue, and what it read to decide."""

    mode: Mode
    engine: str
    change_rows: int  # feed rows (all change types) inside the window; 0 for a sweep
    documents: int  # distinct ids changed in the window; for a sweep, pending rows found
    pending: tuple[PendingDocument, ...]  # sorted by id
    tail_rows: int = 0  # feed rows read after the window, for the current-row re-check
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    def key(self) -> tuple[Any, ...]:
        """What two engines must agree on (timings and the engine name excluded)."""
        return (self.mode, self.change_rows, self.documents, self.pending, self.tail_rows)


class Engine(Protocol):
    """A way to read the table: ``local`` (delta-rs) or ``spark``."""

    name: str

    def plan_feed(self, table_uri: str, window: FeedWindow) -> Plan:
        """Plan from the change feed. Raises ``FeedUnavailableError`` when the feed is gone."""
        ...

    def plan_sweep(self, table_uri: str, version: int) -> Plan:
        """Plan from a full scan of the rows at ``version`` (every pending document)."""
        ...

    def close(self) -> None: ...


def pending_from_rows(rows: Iterable[Sequence[Any]]) -> tuple[PendingDocument, ...]:
    """Sorted, de-duplicated ``PendingDocument``s from (id, last_seq, dispatched_seq,
    incarnation) rows (a row without the fourth value has a null incarnation)."""
    docs = {str(r[0]): _pending(r) for r in rows}
    return tuple(docs[k] for k in sorted(docs))


def _pending(r: Sequence[Any]) -> PendingDocument:
    incarnation = r[3] if len(r) > 3 else None
    return PendingDocument(
        str(r[0]), int(r[1]), int(r[2]), None if incarnation is None else str(incarnation)
    )


def sweep_plan(engine: str, rows: Iterable[Sequence[Any]], read_s: float) -> Plan:
    """The plan of a full sweep from (id, last_seq, dispatched_seq, incarnation) rows, whichever
    engine read them: no feed rows, one document per pending row."""
    pending = pending_from_rows(rows)
    return Plan("sweep", engine, 0, len(pending), pending, 0, {"read_s": read_s, "plan_s": 0.0})


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an error's message (its type name when it has none), for one-line CLIs."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def feed_unavailable(uri: str, window: FeedWindow, e: BaseException) -> FeedUnavailableError:
    """The one message for "the feed is gone for this window", whichever engine found out."""
    return FeedUnavailableError(
        f"the change data feed of {uri} cannot be read for versions {window.start + 1}.."
        f"{window.latest}: {first_line(e)}",
        hint="keep vacuum retention and delta.logRetentionDuration above the rescuer's lag; "
        "this pass falls back to a full sweep",
    )


def is_driver_error(e: BaseException) -> bool:
    """An error from the storage drivers under an engine: an ``OSError`` (network, disk,
    permissions), deltalake's ``DeltaError`` family, or pyarrow's ``ArrowException``."""
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    return isinstance(e, OSError | DeltaError | pa.ArrowException)


@contextmanager
def driver_errors(
    what: str, *, uri: str | None = None, storage_options: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Translate a driver error raised inside the block into ``EngineError`` ("<what> failed:
    ..."), so callers (the scheduler, the CLI) only ever see our error tree. Our own errors and
    anything that is not a driver error (a bug) pass through unchanged. With the table's ``uri``,
    a damaged log is said to be one (``StoreError``): retrying the pass would not help."""
    try:
        yield
    except OutboxError:
        raise
    except Exception as e:
        if not is_driver_error(e):
            raise
        damaged = damaged_log_error(uri, e, storage_options) if uri is not None else None
        if damaged is not None:
            raise damaged from e
        raise EngineError(
            f"{what} failed: {type(e).__name__}: {first_line(e)}",
            hint="check that the table's storage is reachable; the next pass retries the same "
            "window",
        ) from e

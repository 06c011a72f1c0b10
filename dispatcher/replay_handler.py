"""Replaying messages from the table's history: the ``ReplayMessages`` command and its handler.

``outbox replay`` (``outbox.app.replay``) plans which messages were committed in a range of table
versions and enqueues them in chunks, each a ``ReplayMessages`` command naming the message ids of
one bucket and the commit versions they were first written in. The ``run-dispatcher`` worker
hands those commands here (``DispatcherWorker`` routes by subject): the chunks' versions are read
again from the change data feed, once for the chunks received together (the command carries ids,
not bodies), and each chunk's messages are sent through the transport in commit order, coalesced
as the transport allows, with a header naming the replay. No watermark moves and no key gate is consulted: a replay re-sends what was already
sent once, and the document's own dispatch goes on beside it.

Why the design holds up under crashes:

* the command id is ``rp-<replay>-<chunk>``, so a planner that crashed and was resumed enqueues
  nothing twice (the queue drops repeats);
* the session is ``replay:<replay>:<bucket>``: one worker at a time holds a bucket's chunks, in
  their order, so a document's replayed messages keep their seq order;
* a chunk is recorded in ``outbox_replay_chunks`` after its sends and before the command is
  completed: a worker that dies before the record gets the chunk again after the lock expires and
  sends it again with the same ids (at least once, as every send here); one redelivered after the
  record completes it without sending.

Message ids: the original ones by default (consumers' inboxes drop what they handled), or with
``--new-ids`` ``sha256(replay|message_id)`` cut to 32 hex characters, the same on every retry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import func, insert, select, update

from dispatcher.command_handler import CommandHandler, WorkerStats
from dispatcher.queue.lock_renewer import LockRenewer, Unsettled
from dispatcher.replay_feed import chunk_rows, read_feed, spans
from dispatcher.sending import coalesces
from dispatcher.transports.base import TransportMessage
from migrations.sql.tables import replay_chunks, replays
from outbox.core.errors import OutboxError, PermanentTransportError, ValidationError
from outbox.core.observers import Settlement

if TYPE_CHECKING:
    from dispatcher.queue.database import Database
    from dispatcher.queue.messages import QueueMessage, ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.replay")

REPLAY_SUBJECT = "ReplayMessages"
#: The header every replayed message carries: the replay's id.
REPLAY_HEADER = "outbox-replay"


def replayed_id(replay_id: str, message_id: str) -> str:
    """A replayed message's id under ``--new-ids``: ``sha256(replay|message_id)`` cut to 32 hex
    characters like ``message_id_for``'s, so every retry of the replay sends the same new id."""
    return hashlib.sha256(f"{replay_id}|{message_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class ReplayMessages:
    """One chunk of a replay: message ids of one bucket, first written in ``from_version`` to
    ``to_version`` (both inclusive)."""

    table: str  # the table id
    replay: str
    chunk: int
    bucket: int
    from_version: int
    to_version: int
    message_ids: tuple[str, ...]
    new_ids: bool = False

    @property
    def command_id(self) -> str:
        return f"rp-{self.replay}-{self.chunk}"

    @property
    def session_id(self) -> str:
        return f"replay:{self.replay}:{self.bucket}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "table": self.table,
                "replay": self.replay,
                "chunk": self.chunk,
                "bucket": self.bucket,
                "from_version": self.from_version,
                "to_version": self.to_version,
                "message_ids": list(self.message_ids),
                "new_ids": self.new_ids,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, body: str | bytes) -> ReplayMessages:
        try:
            data: Any = json.loads(body)
            return cls(
                table=str(data["table"]),
                replay=str(data["replay"]),
                chunk=int(data["chunk"]),
                bucket=int(data["bucket"]),
                from_version=int(data["from_version"]),
                to_version=int(data["to_version"]),
                message_ids=tuple(str(m) for m in data["message_ids"]),
                new_ids=bool(data.get("new_ids", False)),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValidationError(
                f"malformed ReplayMessages command: {e}",
                hint="replay commands are written by `outbox replay`; requeue none by hand",
            ) from e

    def to_queue_message(self) -> QueueMessage:
        from dispatcher.queue.messages import QueueMessage

        return QueueMessage(
            body=self.to_json(),
            message_id=self.command_id,
            session_id=self.session_id,
            subject=REPLAY_SUBJECT,
            content_type="application/json",
        )


# --- what the workers record -------------------------------------------------------------------


class ChunkLog:
    """The chunks sent, in the SQL database (``outbox_replay_chunks``), and the replay's end."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def recorded(self, chunks: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
        """Which of these (replay, chunk) are recorded as sent: one read for a batch."""
        wanted = set(chunks)
        if not wanted:
            return set()
        with self.db.read("read a replay's chunks") as c:
            rows = c.execute(
                select(replay_chunks.c.replay_id, replay_chunks.c.chunk).where(
                    replay_chunks.c.replay_id.in_(sorted({r for r, _ in wanted})),
                    replay_chunks.c.chunk.in_(sorted({n for _, n in wanted})),
                )
            ).all()
        return {(str(r), int(n)) for r, n in rows} & wanted

    def record(self, replay_id: str, chunk: int, messages: int, at: datetime) -> str:
        """Record the chunk sent (once: a repeat is a no-op), and the replay done when every
        planned chunk is; returns the replay's progress in words, for the worker's log line."""
        with self.db.write("record a replayed chunk") as c:
            exists = c.execute(
                select(replay_chunks.c.chunk).where(
                    replay_chunks.c.replay_id == replay_id, replay_chunks.c.chunk == chunk
                )
            ).first()
            if exists is None:
                c.execute(
                    insert(replay_chunks).values(
                        replay_id=replay_id, chunk=chunk, messages=messages, sent_at=at
                    )
                )
            done = finish_if_done(c, replay_id, at)
            sent, total = c.execute(
                select(
                    func.coalesce(func.sum(replay_chunks.c.messages), 0),
                    select(replays.c.messages)
                    .where(replays.c.replay_id == replay_id)
                    .scalar_subquery(),
                ).where(replay_chunks.c.replay_id == replay_id)
            ).one()
        return f"{sent} of {'?' if total is None else total} message(s) sent" + (
            ", done" if done else ""
        )


def finish_if_done(conn: Any, replay_id: str, at: datetime) -> bool:
    """Mark the replay done when it is fully enqueued and every chunk was sent (in the caller's
    write transaction). True when it is done."""
    sent = (
        select(func.count())
        .select_from(replay_chunks)
        .where(replay_chunks.c.replay_id == replay_id)
        .scalar_subquery()
    )
    conn.execute(
        update(replays)
        .where(
            replays.c.replay_id == replay_id,
            replays.c.status == "enqueued",
            replays.c.chunks == sent,
        )
        .values(status="done", finished_at=at, updated_at=at)
    )
    status = conn.execute(select(replays.c.status).where(replays.c.replay_id == replay_id)).scalar()
    return bool(status == "done")


# --- the handler -------------------------------------------------------------------------------

#: A span's feed, or why it could not be read (each of its chunks is retried with that error).
Feeds = dict[tuple[int, int], pa.Table | Exception]
#: Received commands with their chunks, in queue order.
Chunks = list[tuple["ReceivedMessage", ReplayMessages]]


class ReplayHandler:
    """Sends the chunks of ``ReplayMessages`` commands; settles each as ``CommandHandler`` does
    (its retry, dead-letter and settle steps: one policy for every command).

    A batch's chunks are read from the feed together: one read per span of versions they need
    (``replay_feed.spans``), not one per chunk, for a read's fixed cost (the log's commits, the
    query's plan) is most of a chunk's; each chunk then takes its rows from it, in its
    command's order (the planner's), and is sent, recorded and completed on its own."""

    def __init__(self, runtime: DispatcherRuntime, settle: CommandHandler) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.queue = runtime.commands
        self.clock = runtime.clock
        self.settle = settle
        self.hook = runtime.crash_points
        self._table: Any = None
        self._lock = threading.Lock()
        self._chunks: ChunkLog | None = None

    @property
    def chunks(self) -> ChunkLog:
        if self._chunks is None:
            self._chunks = ChunkLog(self.runtime.queue.database)
        return self._chunks

    def handle(self, received: Sequence[ReceivedMessage]) -> WorkerStats:
        """Send each chunk in queue order; a chunk that fails stops the later chunks of its
        session in this batch (they are released, to come after it again)."""
        batch = WorkerStats(batches=1, commands=len(received))
        held = Unsettled(received)
        s = self.settle
        try:
            with LockRenewer(self.queue, held, self.clock, check_interval=s.renew_check_interval):
                ordered = sorted(received, key=lambda m: m.sequence_number)
                todo = self._unrecorded(batch, held, self._parsed(batch, held, ordered))
                feeds = self._feeds([cmd for _, cmd in todo])
                stopped: set[str | None] = set()
                for msg, cmd in todo:
                    if msg.session_id in stopped:
                        self._release(batch, held, msg)
                        continue
                    if not self._one(batch, held, msg, cmd, feeds):
                        stopped.add(msg.session_id)
        finally:
            held.clear()
        return batch

    def _release(self, batch: WorkerStats, held: Unsettled, msg: ReceivedMessage) -> None:
        """Give a later chunk of a stopped session back at once: it comes after the failed one
        again (session FIFO), whenever that one is retried."""
        self.settle._settle(
            batch, held, msg, Settlement.ABANDON, lambda: self.queue.abandon(msg, 0)
        )

    def _parsed(
        self, batch: WorkerStats, held: Unsettled, received: Sequence[ReceivedMessage]
    ) -> Chunks:
        """The commands this worker can send; a malformed one or another table's is
        dead-lettered."""
        s = self.settle
        out: Chunks = []
        for msg in received:
            try:
                cmd = ReplayMessages.from_json(msg.body)
            except OutboxError as e:
                s._dead_letter(batch, held, msg, "MalformedCommand", str(e))
                continue
            if cmd.table != self.store.table_id:
                s._dead_letter(
                    batch,
                    held,
                    msg,
                    "WrongTable",
                    f"replay {cmd.replay} is for table {cmd.table}; this worker serves table "
                    f"{self.store.table_id} at {self.store.uri}",
                )
                continue
            out.append((msg, cmd))
        return out

    def _unrecorded(self, batch: WorkerStats, held: Unsettled, todo: Chunks) -> Chunks:
        """The chunks not recorded as sent yet; one delivered again after its record is
        completed without a send."""
        s = self.settle
        try:
            done = self.chunks.recorded((cmd.replay, cmd.chunk) for _, cmd in todo)
        except Exception as e:  # retried with backoff, as a failed send
            for msg, cmd in todo:
                s._retry(batch, held, msg, f"replay chunk {cmd.chunk} of {cmd.replay}: {e}")
            return []
        rest: Chunks = []
        for msg, cmd in todo:
            if (cmd.replay, cmd.chunk) in done:
                s._complete(batch, held, msg)
            else:
                rest.append((msg, cmd))
        return rest

    def _one(
        self,
        batch: WorkerStats,
        held: Unsettled,
        msg: ReceivedMessage,
        cmd: ReplayMessages,
        feeds: Feeds,
    ) -> bool:
        """Send, record and complete one chunk; False when its session must stop here."""
        s = self.settle
        try:
            sent = self.send(cmd, _feed_of(cmd, feeds))
            progress = self.chunks.record(cmd.replay, cmd.chunk, sent, self.clock.now())
        except PermanentTransportError as e:
            s._dead_letter(batch, held, msg, "PermanentTransportError", str(e))
            return False
        except Exception as e:  # retried with backoff, dead-lettered after the most deliveries
            s._retry(batch, held, msg, f"replay chunk {cmd.chunk} of {cmd.replay}: {e}")
            return False
        batch.messages_sent += sent
        s._complete(batch, held, msg)
        log.info(
            "replay %s: chunk %d sent (%d message(s)); %s", cmd.replay, cmd.chunk, sent, progress
        )
        return True

    def send(self, cmd: ReplayMessages, feed: pa.Table) -> int:
        """Send the chunk's messages from ``feed`` (its span's); returns how many were sent.
        Raises what the transport raised, or that the feed lacks some of them."""
        messages = self.messages(cmd, feed)
        transport = self.runtime.transport
        for part in _batches(
            messages,
            self.runtime.dispatcher.max_batch_messages,
            coalesces(transport),
        ):
            transport.send(part)
            self.hook.hit("mid_batch")  # between two sends of a chunk: where a crash proves resume
        return len(messages)

    def messages(self, cmd: ReplayMessages, feed: pa.Table) -> list[TransportMessage]:
        """The chunk's messages as the transport takes them, in the planner's order."""
        found, missing = chunk_rows(
            feed, cmd.bucket, cmd.from_version, cmd.to_version, cmd.message_ids
        )
        if missing:
            raise OutboxError(
                f"{len(missing)} message(s) of the chunk are not in versions "
                f"{cmd.from_version}..{cmd.to_version} of bucket {cmd.bucket} (e.g. "
                f"{sorted(missing)[0]})",
                hint="the table's history was rewritten; replay the range again",
            )
        return _transport_messages(found, cmd)

    def _feeds(self, cmds: Sequence[ReplayMessages]) -> Feeds:
        """The feed of each span of versions the chunks need (of their buckets only), sorted
        by commit; a span that cannot be read holds the error instead."""
        out: Feeds = {}
        for start, end in spans((c.from_version, c.to_version) for c in cmds):
            inside = {c.bucket for c in cmds if start <= c.from_version and c.to_version <= end}
            predicate = f"bucket IN ({', '.join(str(b) for b in sorted(inside))})"
            try:
                with self._lock:
                    dt = self._delta_table(end)
                    feed = read_feed(dt, start, end, predicate=predicate, full=True)
                out[(start, end)] = feed.sort_by([("_commit_version", "ascending")])
            except Exception as e:  # each chunk of the span is retried with it
                out[(start, end)] = e
        return out

    def _delta_table(self, version: int) -> Any:
        """One handle, moved forward only when a chunk needs a newer version."""
        from deltalake import DeltaTable

        if self._table is None:
            self._table = DeltaTable(
                self.store.uri, storage_options=self.store._storage_options or None
            )
        if int(self._table.version()) < version:
            self._table.update_incremental()
        return self._table


def _feed_of(cmd: ReplayMessages, feeds: Feeds) -> pa.Table:
    """The feed of the span holding the chunk's versions; raises its read's error."""
    for (start, end), feed in feeds.items():
        if start <= cmd.from_version and cmd.to_version <= end:
            if isinstance(feed, Exception):
                raise feed
            return feed
    raise AssertionError(f"no span read for versions {cmd.from_version}..{cmd.to_version}")


def _transport_messages(found: pa.Table, cmd: ReplayMessages) -> list[TransportMessage]:
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
            headers[REPLAY_HEADER] = cmd.replay
            shared[raw] = headers
        out.append(
            TransportMessage(
                message_id=replayed_id(cmd.replay, original) if cmd.new_ids else original,
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


def _batches(
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

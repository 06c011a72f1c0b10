"""Replaying messages from the table's history: the ``ReplayMessages`` command and its handler.

``outbox replay`` (``outbox.app.replay``) plans which messages were committed in a range of table
versions and enqueues them in chunks, each a ``ReplayMessages`` command naming the message ids of
one bucket and the commit versions they were first written in. The ``run-dispatcher`` worker
hands those commands here (``DispatcherWorker`` routes by subject): the chunk's versions are read
again from the change data feed (the command carries ids, not bodies), and its messages are sent
through the transport in commit order, coalesced as the transport allows, with a header naming
the replay. No watermark moves and no key gate is consulted: a replay re-sends what was already
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
from dispatcher.replay_feed import first_appearances, read_feed
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

    def sent(self, replay_id: str, chunk: int) -> bool:
        with self.db.read("read a replay's chunks") as c:
            found = c.execute(
                select(replay_chunks.c.chunk).where(
                    replay_chunks.c.replay_id == replay_id, replay_chunks.c.chunk == chunk
                )
            ).first()
        return found is not None

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


class ReplayHandler:
    """Sends the chunks of ``ReplayMessages`` commands; settles each as ``CommandHandler`` does
    (its retry, dead-letter and settle steps: one policy for every command)."""

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
                stopped: set[str | None] = set()
                for msg in sorted(received, key=lambda m: m.sequence_number):
                    if msg.session_id in stopped:
                        self._release(batch, held, msg)
                        continue
                    if not self._one(batch, held, msg):
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

    def _one(self, batch: WorkerStats, held: Unsettled, msg: ReceivedMessage) -> bool:
        """Handle one command; False when its session must stop here."""
        s = self.settle
        try:
            cmd = ReplayMessages.from_json(msg.body)
        except OutboxError as e:
            s._dead_letter(batch, held, msg, "MalformedCommand", str(e))
            return True
        if cmd.table != self.store.table_id:
            s._dead_letter(
                batch,
                held,
                msg,
                "WrongTable",
                f"replay {cmd.replay} is for table {cmd.table}; this worker serves table "
                f"{self.store.table_id} at {self.store.uri}",
            )
            return True
        try:
            if self.chunks.sent(cmd.replay, cmd.chunk):  # redelivered after its record
                s._complete(batch, held, msg)
                return True
            sent = self.send(cmd)
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

    def send(self, cmd: ReplayMessages) -> int:
        """Read the chunk's messages from the feed and send them; returns how many were sent.
        Raises what the transport or the feed raised."""
        messages = self.messages(cmd)
        transport = self.runtime.transport
        for part in _batches(
            messages,
            self.runtime.dispatcher.max_batch_messages,
            coalesces(transport),
        ):
            transport.send(part)
            self.hook.hit("mid_batch")  # between two sends of a chunk: where a crash proves resume
        return len(messages)

    def messages(self, cmd: ReplayMessages) -> list[TransportMessage]:
        """The chunk's messages as the transport takes them, in the planner's order."""
        with self._lock:
            dt = self._delta_table(cmd.to_version)
            found = read_feed(
                dt, cmd.from_version, cmd.to_version, predicate=f"bucket = {cmd.bucket}", full=True
            )
        wanted = pa.array(cmd.message_ids, pa.string())
        found = first_appearances(found.filter(pc.is_in(found["message_id"], value_set=wanted)))
        if found.num_rows != len(set(cmd.message_ids)):
            missing = set(cmd.message_ids) - set(found["message_id"].to_pylist())
            raise OutboxError(
                f"{len(missing)} message(s) of the chunk are not in versions "
                f"{cmd.from_version}..{cmd.to_version} of bucket {cmd.bucket} (e.g. "
                f"{sorted(missing)[0]})",
                hint="the table's history was rewritten; replay the range again",
            )
        return list(_transport_messages(found, cmd))

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


def _transport_messages(found: pa.Table, cmd: ReplayMessages) -> Iterable[TransportMessage]:
    for doc_id, m in zip(found["id"].to_pylist(), found["message"].to_pylist(), strict=True):
        headers = json.loads(m["headers"]) if m.get("headers") else {}
        headers[REPLAY_HEADER] = cmd.replay
        original = str(m["message_id"])
        yield TransportMessage(
            message_id=replayed_id(cmd.replay, original) if cmd.new_ids else original,
            destination=str(m["destination"]),
            body=str(m["body"]).encode("utf-8"),
            subject=str(m["type"]),
            content_type=m.get("content_type") or "application/json",
            session_id=m.get("ordering_key") or str(doc_id),
            scheduled_at=m.get("deliver_at"),
            correlation_id=m.get("correlation_id"),
            headers=headers,
        )


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

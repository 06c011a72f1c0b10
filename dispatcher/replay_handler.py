"""Replaying messages from the table's history: the ``ReplayMessages`` command and its handler.

``outbox replay`` (``outbox.app.replay``) plans which messages were committed in a range of table
versions and enqueues them in chunks, each a ``ReplayMessages`` command naming the message ids of
one bucket and the commit versions they were first written in. The ``run-dispatcher`` worker
hands those commands here (``DispatcherWorker`` routes by subject): the chunks' versions are read
again from the change data feed, once for the chunks received together (the command carries ids,
not bodies), and their messages are sent through the transport in commit order, chunks sharing a
send as documents do in the dispatcher's coalesced path, with a header naming the replay. No
watermark moves and no key gate is consulted: a replay re-sends what was already sent once, and
the document's own dispatch goes on beside it.

Why the design holds up under crashes:

* the command id is ``rp-<replay>-<chunk>``, so a planner that crashed and was resumed enqueues
  nothing twice (the queue drops repeats);
* the session is ``replay:<replay>:<bucket>``: one worker at a time holds a bucket's chunks, in
  their order, so a document's replayed messages keep their seq order;
* a chunk is recorded in ``outbox_replay_chunks`` after its sends, and its command completed in
  the same transaction when the command queue is that database (else just after): a worker that
  dies before the record gets the chunk again after the lock expires and sends it again with the
  same ids (at least once, as every send here); one redelivered after the record is completed
  without a send.

Message ids: the original ones by default (consumers' inboxes drop what they handled), or with
``--new-ids`` ``sha256(replay|message_id)`` cut to 32 hex characters, the same on every retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dispatcher.command_handler import CommandHandler, WorkerStats
from dispatcher.queue.lock_renewer import LockRenewer, Unsettled
from dispatcher.replay_chunks import ChunkLog, finish_if_done
from dispatcher.replay_command import REPLAY_SUBJECT, ReplayMessages
from dispatcher.replay_feed import (
    REPLAY_HEADER,
    batches,
    chunk_rows,
    packed,
    read_feed,
    replayed_id,
    spans,
    transport_messages,
)
from dispatcher.sending import coalesces
from dispatcher.transports.base import TransportMessage
from outbox.core.errors import OutboxError, PermanentTransportError
from outbox.core.observers import Settlement

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.runtime import DispatcherRuntime

log = logging.getLogger("outbox.replay")

#: What the planner and the tests import from here.
__all__ = [
    "REPLAY_HEADER",
    "REPLAY_SUBJECT",
    "ChunkLog",
    "ReplayHandler",
    "ReplayMessages",
    "finish_if_done",
    "replayed_id",
]


# --- the handler -------------------------------------------------------------------------------

#: A span's feed, or why it could not be read (each of its chunks is retried with that error).
Feeds = dict[tuple[int, int], pa.Table | Exception]
#: Received commands with their chunks, in queue order.
Chunks = list[tuple["ReceivedMessage", ReplayMessages]]
#: ... and each chunk's messages.
Built = tuple["ReceivedMessage", ReplayMessages, list[TransportMessage]]


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
        """Send the chunks in queue order, many to a send as the transport allows; a chunk that
        fails stops the later chunks of its session in this batch (they are released, to come
        after it again)."""
        batch = WorkerStats(batches=1, commands=len(received))
        held = Unsettled(received)
        s = self.settle
        try:
            with LockRenewer(self.queue, held, self.clock, check_interval=s.renew_check_interval):
                ordered = sorted(received, key=lambda m: m.sequence_number)
                todo = self._unrecorded(batch, held, self._parsed(batch, held, ordered))
                self._send_together(batch, held, self._built(batch, held, todo))
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
                s._retry(batch, held, msg, _why(cmd, e))
            return []
        rest: Chunks = []
        for msg, cmd in todo:
            if (cmd.replay, cmd.chunk) in done:
                s._complete(batch, held, msg)
            else:
                rest.append((msg, cmd))
        return rest

    def _built(self, batch: WorkerStats, held: Unsettled, todo: Chunks) -> list[Built]:
        """Each chunk with its messages, from one feed read per span; a chunk whose messages
        cannot be had is retried (and stops its session)."""
        feeds = self._feeds([cmd for _, cmd in todo])
        out: list[Built] = []
        stopped: set[str | None] = set()
        for msg, cmd in todo:
            if msg.session_id in stopped:
                self._release(batch, held, msg)
                continue
            try:
                out.append((msg, cmd, self.messages(cmd, _feed_of(cmd, feeds))))
            except Exception as e:  # retried with backoff, dead-lettered after the most deliveries
                self.settle._retry(batch, held, msg, _why(cmd, e))
                stopped.add(msg.session_id)
        return out

    def _send_together(self, batch: WorkerStats, held: Unsettled, built: list[Built]) -> None:
        """The chunks' messages in sends of up to ``max_batch_messages``, chunks sharing a send
        as documents do in the dispatcher's coalesced path (one session's run per send for a
        transport that does not coalesce); after each send, the chunks it finished are recorded
        and completed in one write. A failed send falls back to a chunk at a time for every
        chunk not recorded yet (as the dispatcher retries a failed coalesced batch per
        document), so one bad chunk fails alone; their messages already sent go again (at
        least once, as every send here)."""
        transport = self.runtime.transport
        most = self.runtime.dispatcher.max_batch_messages
        recorded = 0
        for part, finished in packed([m for _, _, m in built], most, coalesces(transport)):
            if part:
                try:
                    transport.send(part)
                except Exception as e:
                    log.info(
                        "replay: a send of %d message(s) failed (%s); its chunks and the "
                        "later ones go one at a time",
                        len(part),
                        e,
                    )
                    self._one_by_one(batch, held, built[recorded:])
                    return
                self.hook.hit("mid_batch")  # between two sends: where a crash proves resume
            self._finished(batch, held, built[recorded:finished])
            recorded = finished

    def _one_by_one(self, batch: WorkerStats, held: Unsettled, built: list[Built]) -> None:
        stopped: set[str | None] = set()
        for msg, cmd, messages in built:
            if msg.session_id in stopped:
                self._release(batch, held, msg)
            elif not self._one(batch, held, msg, cmd, messages):
                stopped.add(msg.session_id)

    def _one(
        self,
        batch: WorkerStats,
        held: Unsettled,
        msg: ReceivedMessage,
        cmd: ReplayMessages,
        messages: list[TransportMessage],
    ) -> bool:
        """Send, record and complete one chunk; False when its session must stop here."""
        s = self.settle
        transport = self.runtime.transport
        try:
            for part in batches(
                messages, self.runtime.dispatcher.max_batch_messages, coalesces(transport)
            ):
                transport.send(part)
                self.hook.hit("mid_batch")
        except PermanentTransportError as e:
            s._dead_letter(batch, held, msg, "PermanentTransportError", str(e))
            return False
        except Exception as e:  # retried with backoff, dead-lettered after the most deliveries
            s._retry(batch, held, msg, _why(cmd, e))
            return False
        return self._finished(batch, held, [(msg, cmd, messages)])

    def _finished(self, batch: WorkerStats, held: Unsettled, done: list[Built]) -> bool:
        """Record the chunks sent and complete their commands: in the record's transaction when
        the command queue is the chunk log's database, else each after it. A record that fails
        retries the chunks (sent again: at least once). False when it failed."""
        if not done:
            return True
        s = self.settle
        now = self.clock.now()
        complete_in = self._complete_in()

        def complete(conn: Any) -> list[bool]:
            assert complete_in is not None
            return [complete_in(conn, msg, now) for msg, _, _ in done]

        try:
            words, completed = self.chunks.record_all(
                [(cmd.replay, cmd.chunk, len(m)) for _, cmd, m in done],
                now,
                complete if complete_in is not None else None,
            )
        except Exception as e:
            for msg, cmd, _ in done:
                s._retry(batch, held, msg, _why(cmd, e))
            return False
        for i, (msg, cmd, messages) in enumerate(done):
            batch.messages_sent += len(messages)
            if completed is None:
                s._complete(batch, held, msg)
            else:
                self._completed_in(batch, held, msg, completed[i])
            log.info(
                "replay %s: chunk %d sent (%d message(s)); %s",
                cmd.replay,
                cmd.chunk,
                len(messages),
                words[i],
            )
        return True

    def _complete_in(self) -> Callable[[Any, ReceivedMessage, datetime], bool] | None:
        """The command queue's completion inside a transaction of the chunk log's database, when
        it is that database (the embedded default); else None."""
        from dispatcher.queue.sql_queue import SqlQueue

        q = self.queue
        if isinstance(q, SqlQueue) and q.database is self.chunks.db:
            return q.receiver.complete_in
        return None

    def _completed_in(
        self, batch: WorkerStats, held: Unsettled, msg: ReceivedMessage, ok: bool
    ) -> None:
        """Count a completion made in the record's transaction as ``CommandHandler._settle``
        counts its own: a lost lock means the command comes again, and is completed without a
        send (its chunk is recorded)."""
        held.pop(msg)
        if ok:
            batch.completed += 1
            self.settle.observe.settled(Settlement.COMPLETE)
        else:
            batch.lock_lost += 1
            self.settle.observe.settled(Settlement.LOCK_LOST)
            log.info(
                "command %s: lock lost before it was completed; it is redelivered", msg.message_id
            )

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
        return transport_messages(found, cmd.replay, cmd.new_ids)

    def _feeds(self, cmds: Sequence[ReplayMessages]) -> Feeds:
        """The feed of each span of versions the chunks need (of their buckets only), sorted
        by commit; a span that cannot be read holds the error instead."""
        out: Feeds = {}
        for start, end in spans((c.from_version, c.to_version) for c in cmds):
            inside = {c.bucket for c in cmds if start <= c.from_version and c.to_version <= end}
            try:
                with self._lock:
                    dt = self._delta_table(end)
                    feed = read_feed(dt, start, end, predicate=None, full=True, buckets=inside)
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


def _why(cmd: ReplayMessages, e: BaseException) -> str:
    return f"replay chunk {cmd.chunk} of {cmd.replay}: {e}"

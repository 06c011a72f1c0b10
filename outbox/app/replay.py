"""``outbox replay``: re-send the messages committed in a range of the table's history.

A replay is a row in ``outbox_replays`` (the SQL database, revision 0009): its range, predicate
and flags, the chunks planned and the cursor of those enqueued. Starting one:

1. resolve the range (versions or times) against the retained history (``replay_plan``);
2. write the row (status ``planning``): from now on it holds the log trim at the range's start,
   as a lagging rescuer does (``replay_status.holding_versions``, read by the trim);
3. plan the messages (``replay_plan.plan_replay``) and record how many, in how many chunks;
4. enqueue the chunks from the cursor as ``ReplayMessages`` commands (deterministic ids: the
   queue drops repeats), moving the cursor after each group of commands;
5. status ``enqueued``; the workers send the chunks (``dispatcher.replay_handler``) and the last
   one marks it ``done``, which lets the trim go.

A planner that dies anywhere in 3-4 is finished by ``outbox replay --resume ID``: the same
history gives the same plan, and it goes on from the cursor (a repeat of the last group is dropped
by the queue, or, past its duplicate-detection window, completed by the worker without a send
because the chunk is recorded as sent).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update

from dispatcher.replay_handler import ReplayMessages, finish_if_done
from migrations.sql.tables import replay_chunks, replays
from outbox.app.replay_plan import (
    CHUNK_MESSAGES,
    Chunk,
    Plan,
    Range,
    commits,
    parse_point,
    plan_replay,
    resolve_range,
)
from outbox.core.clock import Clock
from outbox.core.errors import OutboxError, ValidationError

if TYPE_CHECKING:
    from dispatcher.queue.database import Database
    from outbox.app.replay_status import ReplayStatus
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore

#: Commands per send while enqueueing (and per cursor move).
ENQUEUE_GROUP = 50
#: Finished replays deleted per write while pruning (with their chunk rows).
PRUNE_GROUP = 100


@dataclass
class ReplayRequest:
    """What the command line asked for."""

    start: str
    end: str
    predicate: str | None = None
    destination: str | None = None
    new_ids: bool = False


@dataclass(frozen=True)
class PlannedReplay:
    """A replay planned and recorded, with the cursor to enqueue from."""

    replay_id: str
    new_ids: bool
    chunks: list[Chunk]
    cursor: int
    messages: int


# --- planning --------------------------------------------------------------------------------


def resolve(store: DeltaDocumentStore, settings: Settings, request: ReplayRequest) -> Range:
    """The request's range as versions, checked against the retained history."""
    return resolve_range(
        parse_point(request.start, "--from"),
        parse_point(request.end, "--to"),
        commits(store.delta_table),
        latest=store.refresh(),
        log_retention=settings.log_retention,
    )


def make_plan(store: DeltaDocumentStore, settings: Settings, request: ReplayRequest) -> Plan:
    """Resolve the range and plan its messages (nothing written: the dry run's whole work)."""
    return plan_range(store, resolve(store, settings, request), request)


def plan_range(store: DeltaDocumentStore, rng: Range, request: ReplayRequest) -> Plan:
    from deltalake import DeltaTable

    before = None
    if rng.start > 0:
        before = DeltaTable(
            store.uri, version=rng.start - 1, storage_options=store._storage_options or None
        )
    return plan_replay(
        store.delta_table,
        before,
        rng,
        predicate=request.predicate,
        destination=request.destination,
    )


def counts_dict(plan: Plan) -> list[dict[str, Any]]:
    return [{"destination": d, "type": t, "messages": n} for d, t, n in plan.counts()]


# --- running ---------------------------------------------------------------------------------


class Replays:
    """The replays of one workspace: their rows, planning and enqueueing."""

    def __init__(
        self,
        settings: Settings,
        store: DeltaDocumentStore,
        db: Database,
        commands: Any,
        clock: Clock,
        *,
        chunk_messages: int = CHUNK_MESSAGES,
    ) -> None:
        self.settings = settings
        self.store = store
        self.db = db
        self.commands = commands  # the command queue (``CommandQueue``)
        self.clock = clock
        self.chunk_messages = chunk_messages

    def start(self, request: ReplayRequest) -> PlannedReplay:
        """Record a new replay and plan it; ``enqueue`` sends its commands."""
        rng = resolve(self.store, self.settings, request)
        replay_id = uuid.uuid4().hex[:16]
        now = self.clock.now()
        with self.db.write("record a new replay") as c:
            c.execute(
                insert(replays).values(
                    replay_id=replay_id,
                    table_id=self.store.table_id,
                    table_uri=self.settings.table_uri,
                    from_version=rng.start,
                    to_version=rng.end,
                    predicate=request.predicate,
                    destination=request.destination,
                    new_ids=request.new_ids,
                    status="planning",
                    enqueued=0,
                    created_at=now,
                    updated_at=now,
                )
            )
        try:
            return self._plan(replay_id, rng, request)
        except OutboxError:  # a predicate that does not apply, say: nothing to resume
            with self.db.write("forget a replay that could not be planned") as c:
                c.execute(delete(replays).where(replays.c.replay_id == replay_id))
            raise

    def resume(self, replay_id: str) -> PlannedReplay:
        """Plan again a replay whose planner stopped; ``enqueue`` goes on from its cursor."""
        row = self._row(replay_id)
        if row.table_id != self.store.table_id:
            raise ValidationError(
                f"replay {replay_id} is of table {row.table_id}, not of {self.settings.table_uri}",
                hint="resume it with the workspace of that table",
            )
        request = ReplayRequest(
            str(row.from_version),
            str(row.to_version),
            row.predicate,
            row.destination,
            bool(row.new_ids),
        )
        return self._plan(replay_id, Range(row.from_version, row.to_version), request)

    def _plan(self, replay_id: str, rng: Range, request: ReplayRequest) -> PlannedReplay:
        plan = plan_range(self.store, rng, request)
        chunks = plan.chunks(self.chunk_messages)
        messages = plan.messages.num_rows
        with self.db.write("record a replay's plan") as c:
            row = c.execute(select(replays).where(replays.c.replay_id == replay_id)).one()
            if row.chunks is not None and (row.chunks, row.messages) != (len(chunks), messages):
                raise OutboxError(
                    f"replay {replay_id} was planned as {row.messages} message(s) in "
                    f"{row.chunks} chunk(s); the table's history now gives {messages} in "
                    f"{len(chunks)}",
                    hint="the history of the range was rewritten; start a new replay",
                )
            c.execute(
                update(replays)
                .where(replays.c.replay_id == replay_id)
                .values(
                    chunks=len(chunks),
                    messages=messages,
                    details=json.dumps({"by_destination_type": counts_dict(plan)}),
                    updated_at=self.clock.now(),
                )
            )
        return PlannedReplay(replay_id, request.new_ids, chunks, int(row.enqueued), messages)

    def enqueue(
        self, run: PlannedReplay, advance: Callable[[int], None] | None = None
    ) -> ReplayStatus:
        """Enqueue the chunks from the cursor, moving it after each group; ``advance(n)`` is
        told the messages of each group enqueued (the progress)."""
        replay_id, chunks = run.replay_id, run.chunks
        if advance is not None:
            advance(sum(len(ch.message_ids) for ch in chunks[: run.cursor]))
        for first in range(run.cursor, len(chunks), ENQUEUE_GROUP):
            group = chunks[first : first + ENQUEUE_GROUP]
            commands = [
                ReplayMessages(
                    table=self.store.table_id,
                    replay=replay_id,
                    chunk=first + i,
                    bucket=ch.bucket,
                    from_version=ch.start,
                    to_version=ch.end,
                    message_ids=ch.message_ids,
                    new_ids=run.new_ids,
                )
                for i, ch in enumerate(group)
            ]
            self.commands.send(
                self.settings.command_queue, [cmd.to_queue_message() for cmd in commands]
            )
            self._moved(replay_id, first + len(group))
            if advance is not None:
                advance(sum(len(ch.message_ids) for ch in group))
        now = self.clock.now()
        with self.db.write("record a replay enqueued") as c:
            c.execute(
                update(replays)
                .where(replays.c.replay_id == replay_id, replays.c.status == "planning")
                .values(status="enqueued", updated_at=now)
            )
            finish_if_done(c, replay_id, now)
        return self.status(replay_id)

    def _moved(self, replay_id: str, cursor: int) -> None:
        """The cursor after a group of commands is in the queue (where ``--resume`` goes on)."""
        with self.db.write("move a replay's cursor") as c:
            c.execute(
                update(replays)
                .where(replays.c.replay_id == replay_id)
                .values(enqueued=cursor, updated_at=self.clock.now())
            )

    def _row(self, replay_id: str) -> Any:
        with self.db.read("read a replay") as c:
            row = c.execute(select(replays).where(replays.c.replay_id == replay_id)).first()
        if row is None:
            raise ValidationError(
                f"no replay {replay_id!r} in this workspace's database",
                hint="`outbox replay --status` lists the replays and their ids",
            )
        return row

    def status(self, replay_id: str) -> ReplayStatus:
        from outbox.app.replay_status import statuses

        return statuses(self.db, replay_id=replay_id)[0]


def prune_finished(db: Database, before: datetime) -> int:
    """Delete the replays that finished before ``before``, with their chunk rows (``outbox
    maintain``, ``replay_retention``); returns how many replays went. A group per short write,
    the oldest first. Never an unfinished replay: it holds the log trim, its row is the cursor
    ``--resume`` goes on from, and its chunk rows are what its workers must not send again."""
    gone = 0
    while True:
        with db.write("prune finished replays") as c:
            ids = list(
                c.execute(
                    select(replays.c.replay_id)
                    .where(replays.c.status == "done", replays.c.finished_at < before)
                    .order_by(replays.c.finished_at)
                    .limit(PRUNE_GROUP)
                ).scalars()
            )
            if not ids:
                return gone
            c.execute(delete(replay_chunks).where(replay_chunks.c.replay_id.in_(ids)))
            deleted = c.execute(
                delete(replays).where(replays.c.replay_id.in_(ids), replays.c.status == "done")
            ).rowcount
        gone += int(deleted)
        if not deleted:  # cannot happen in one transaction; never loop on it
            return gone


@contextmanager
def open_replays(settings: Settings, clock: Clock) -> Iterator[Replays]:
    """The workspace's replays, on its store, SQL database and command queue."""
    from outbox.wiring import Backends

    with Backends(settings, clock=clock) as backends:
        store = backends.document_store()
        yield Replays(
            settings,
            store,
            backends.sql_queue.database,
            backends.command_queue(),
            clock,
            chunk_messages=CHUNK_MESSAGES,  # read now: a test makes chunks small
        )

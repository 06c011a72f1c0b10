"""What the replay workers record in the SQL database: the chunks sent (``outbox_replay_chunks``)
and each replay's end (``outbox_replays.status = 'done'``).

Why apart from the handler (``dispatcher.replay_handler``): the planner (``outbox.app.replay``)
ends a replay with the same rule (``finish_if_done``) when its last chunk was sent before it
marked the replay enqueued, and ``outbox maintain`` prunes the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, insert, select, update

from migrations.sql.tables import replay_chunks, replays

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from dispatcher.queue.database import Database

T = TypeVar("T")


class ChunkLog:
    """The chunks sent, in the SQL database, and the replays' end."""

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
        """``record_all`` of one chunk; its replay's progress in words."""
        words, _ = self.record_all([(replay_id, chunk, messages)], at)
        return words[0]

    def record_all(
        self,
        chunks: Sequence[tuple[str, int, int]],
        at: datetime,
        also: Callable[[Connection], T] | None = None,
    ) -> tuple[list[str], T | None]:
        """Record (replay, chunk, messages) sent, each once (a repeat is a no-op), and each
        replay done when every planned chunk is, in one write; ``also`` runs in the same
        transaction (the commands' completion, when their queue is this database: the record and
        the completion then commit together). Returns each chunk's replay progress in words,
        for the worker's log line, and what ``also`` returned."""
        with self.db.write("record replayed chunks") as c:
            ids = sorted({r for r, _, _ in chunks})
            have = {
                (str(r), int(n))
                for r, n in c.execute(
                    select(replay_chunks.c.replay_id, replay_chunks.c.chunk).where(
                        replay_chunks.c.replay_id.in_(ids),
                        replay_chunks.c.chunk.in_(sorted({n for _, n, _ in chunks})),
                    )
                ).all()
            }
            fresh = {(r, n): m for r, n, m in chunks if (r, n) not in have}
            if fresh:
                c.execute(
                    insert(replay_chunks),
                    [
                        {"replay_id": r, "chunk": n, "messages": m, "sent_at": at}
                        for (r, n), m in fresh.items()
                    ],
                )
            words = {r: _progress(c, r, finish_if_done(c, r, at)) for r in ids}
            result = also(c) if also is not None else None
        return [words[r] for r, _, _ in chunks], result


def _progress(c: Any, replay_id: str, done: bool) -> str:
    sent, total = c.execute(
        select(
            func.coalesce(func.sum(replay_chunks.c.messages), 0),
            select(replays.c.messages).where(replays.c.replay_id == replay_id).scalar_subquery(),
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

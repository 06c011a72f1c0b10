"""The queue's sender: send, schedule (``not_before``) and duplicate detection on ``message_id``.

Duplicate detection: every send upserts ``(queue, message_id)`` into ``duplicate_ids`` and only
ids not seen inside the window come back, so only those are inserted. On PostgreSQL the senders of
one session take an advisory lock first, so sequence order is commit order within a session (see
``rows.lock_sessions``). Pruning expired ids is administration's job; the facade hands the sender
a callback to run after each committed send.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from dispatcher.queue import validation
from dispatcher.queue.database import Database
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.rows import lock_sessions
from migrations.sql.tables import duplicate_ids, queue_messages
from outbox.core.clock import utc
from outbox.core.errors import ValidationError

M = queue_messages


class SqlQueueSender:
    """The ``QueueSender`` of one ``SqlQueue`` (thread safe, like the queue)."""

    def __init__(
        self,
        db: Database,
        options: QueueOptions,
        *,
        after_commit: Callable[[], object] | None = None,
    ) -> None:
        """``after_commit`` runs after a send that committed on its own transaction (not one
        joining a caller's ``conn``); it must never raise (the facade passes duplicate-id
        pruning, which logs its failures)."""
        self._db = db
        self._options = options
        self._after_commit = after_commit

    def send(
        self,
        queue: str,
        messages: QueueMessage | Sequence[QueueMessage],
        *,
        conn: Connection | None = None,
    ) -> list[str]:
        """See ``QueueSender.send``."""
        batch = [messages] if isinstance(messages, QueueMessage) else list(messages)
        return self.send_batch([(queue, m) for m in batch], conn=conn)

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Connection | None = None
    ) -> list[str]:
        """See ``QueueSender.send_batch``."""
        now = self._options.now()
        rows = [self._row(queue, msg, now) for queue, msg in entries]
        unique: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            unique.setdefault((row["queue"], row["message_id"]), row)
        if not unique:
            return []
        cutoff = now - self._options.duplicate_detection_window
        with self._db.write("send messages", conn) as tx:
            if self._db.postgres:
                lock_sessions(tx, ((r["queue"], r["session_id"]) for r in unique.values()))
            dialect_insert = postgresql.insert if self._db.postgres else sqlite.insert
            stmt = dialect_insert(duplicate_ids)
            upsert = stmt.on_conflict_do_update(
                index_elements=[duplicate_ids.c.queue, duplicate_ids.c.message_id],
                set_={"seen_at": stmt.excluded.seen_at},
                where=duplicate_ids.c.seen_at <= cutoff,
            ).returning(duplicate_ids.c.queue, duplicate_ids.c.message_id)
            # Rows come back only for ids not seen inside the window: those are the new ones.
            # executemany (SQLAlchemy batches it as "insertmanyvalues") keeps one cached compiled
            # statement; a literal multi-row VALUES would be recompiled for every batch.
            params = [{"queue": q, "message_id": mid, "seen_at": now} for q, mid in unique]
            fresh = {(r.queue, r.message_id) for r in tx.execute(upsert, params)}
            accepted = [row for key, row in unique.items() if key in fresh]
            if accepted:
                tx.execute(M.insert(), accepted)
        if conn is None and self._after_commit is not None:  # the batch is already committed
            self._after_commit()
        return [row["message_id"] for row in accepted]

    def validate(self, queue: str, msg: QueueMessage) -> None:
        """See ``QueueSender.validate``."""
        self._row(queue, msg, self._options.now())

    def _row(self, queue: str, msg: QueueMessage, now: datetime) -> dict[str, Any]:
        if not isinstance(msg, QueueMessage):
            raise ValidationError(
                f"expected a QueueMessage, got {type(msg).__name__}",
                hint="wrap the payload: QueueMessage(body=...)",
            )
        validation.queue_name(queue)
        message_id = validation.identifier("message_id", msg.message_id)
        assert message_id is not None
        session_id = validation.identifier("session_id", msg.session_id, optional=True)
        validation.identifier("correlation_id", msg.correlation_id, optional=True)
        not_before = validation.aware("not_before", msg.not_before)
        return {
            "queue": queue,
            "message_id": message_id,
            "session_id": session_id,
            "body": validation.body(msg.body, message_id, self._options.max_body_bytes),
            "subject": msg.subject or "",
            "content_type": msg.content_type or "",
            "correlation_id": msg.correlation_id,
            "headers": validation.headers(msg.headers, message_id),
            "enqueued_at": now,
            "not_before": utc(not_before) if not_before is not None else now,
            "delivery_count": 0,
            # scheduled for later: not in its session until its time (docs/sql_queue.md)
            "scheduled": not_before is not None and utc(not_before) > now,
            "deferred": False,
        }

    def close(self) -> None:
        """Close the queue this sender belongs to (its parts share one connection pool)."""
        self._db.close()

"""The queue's sender: send, schedule (``not_before``) and duplicate detection on ``message_id``.

Duplicate detection: every send upserts ``(queue, message_id)`` into ``duplicate_ids`` and only
ids not seen inside the window come back, so only those are inserted. On PostgreSQL both writes
are one statement (a data-modifying CTE, the batch passed as one array per column); on SQLite the
upsert is one multi-row statement and the messages one ``executemany``. Both bypass SQLAlchemy's
per-row parameter processing, the largest cost of a batch (docs/performance-queue.md).
On PostgreSQL the senders of one session take an advisory lock first, so sequence order is commit
order within a session (see ``rows.lock_sessions``). Pruning expired ids is administration's job;
the facade hands the sender a callback to run after each committed send.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from dispatcher.queue import validation
from dispatcher.queue.database import Database
from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.rows import lock_sessions
from migrations.sql.tables import queue_messages
from outbox.core.clock import utc
from outbox.core.errors import ValidationError

M = queue_messages
_MAX = validation.MAX_ID

#: The columns ``_PG_SEND`` takes as arrays, one element per message.
_PG_COLUMNS = (
    "queue",
    "message_id",
    "session_id",
    "body",
    "subject",
    "content_type",
    "correlation_id",
    "headers",
    "not_before",
    "scheduled",
)

# One round trip: the ids go into duplicate_ids (an id seen inside the window keeps its row and
# comes back from nowhere), and only the rows that came back are inserted, in the order given
# (ORDER BY ordinality: sequence numbers are drawn as rows reach the insert). The batch arrives
# as one array per column, so the statement text and its plan never change with the batch size.
_PG_SEND = """
WITH input AS (
    SELECT * FROM unnest(
        %(queue)s::varchar[], %(message_id)s::varchar[], %(session_id)s::varchar[],
        %(body)s::bytea[], %(subject)s::varchar[], %(content_type)s::varchar[],
        %(correlation_id)s::varchar[], %(headers)s::text[], %(not_before)s::timestamptz[],
        %(scheduled)s::boolean[]
    ) WITH ORDINALITY AS i(queue, message_id, session_id, body, subject, content_type,
                           correlation_id, headers, not_before, scheduled, ord)
), fresh AS (
    INSERT INTO outbox_queue_duplicate_ids AS d (queue, message_id, seen_at)
    SELECT queue, message_id, %(now)s FROM input
    ON CONFLICT (queue, message_id) DO UPDATE SET seen_at = EXCLUDED.seen_at
        WHERE d.seen_at <= %(cutoff)s
    RETURNING d.queue, d.message_id
)
INSERT INTO outbox_queue_messages (queue, message_id, session_id, body, subject, content_type,
    correlation_id, headers, enqueued_at, not_before, delivery_count, deferred, scheduled)
SELECT i.queue, i.message_id, i.session_id, i.body, i.subject, i.content_type,
    i.correlation_id, i.headers, %(now)s, i.not_before, 0, false, i.scheduled
FROM input i JOIN fresh f ON f.queue = i.queue AND f.message_id = i.message_id
ORDER BY i.ord
RETURNING queue, message_id
"""

# SQLite has no data-modifying CTEs: the ids' upsert returns the fresh ones (SQLite returns no
# row for a conflict whose DO UPDATE ... WHERE is false), then the messages go in.
_SQLITE_SEEN = """
INSERT INTO outbox_queue_duplicate_ids (queue, message_id, seen_at) VALUES {values}
ON CONFLICT (queue, message_id) DO UPDATE SET seen_at = excluded.seen_at
    WHERE outbox_queue_duplicate_ids.seen_at <= ?
RETURNING queue, message_id
"""
_SQLITE_INSERT = """
INSERT INTO outbox_queue_messages (queue, message_id, session_id, body, subject, content_type,
    correlation_id, headers, enqueued_at, not_before, delivery_count, deferred, scheduled)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?)
"""
#: Ids per upsert statement: 3 parameters each stays far below SQLite's 32,766 variables.
_SQLITE_CHUNK = 500


#: One message as it goes into the database, in ``_PG_COLUMNS`` order.
Row = tuple[str, str, str | None, bytes, str, str, str | None, str, datetime, bool]


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
        unique = self._rows(entries, now)
        if not unique:
            return []
        cutoff = now - self._options.duplicate_detection_window
        rows = list(unique.values())
        if self._db.postgres and conn is None and all(r[2] is None for r in rows):
            # Without sessions to lock the send is one statement, atomic on its own: autocommit
            # saves the BEGIN and COMMIT round trips.
            with self._db.statement("send messages") as tx:
                fresh = self._insert_postgres(tx, rows, now, cutoff)
        else:
            with self._db.write("send messages", conn) as tx:
                if self._db.postgres:
                    lock_sessions(tx, ((r[0], r[2]) for r in rows))  # queue, session
                    fresh = self._insert_postgres(tx, rows, now, cutoff)
                else:
                    fresh = self._insert_sqlite(tx, unique, now, cutoff)
        if conn is None and self._after_commit is not None:  # the batch is already committed
            self._after_commit()
        return [mid for q, mid in unique if (q, mid) in fresh]

    def _insert_postgres(
        self, tx: Connection, rows: list[Row], now: datetime, cutoff: datetime
    ) -> set[tuple[str, str]]:
        """One statement, one round trip: record the ids, insert the messages whose id was not
        seen inside the window, in batch order (see ``_PG_SEND``)."""
        columns = map(list, zip(*rows, strict=True))
        params: dict[str, Any] = dict(zip(_PG_COLUMNS, columns, strict=True))
        params["now"] = now
        params["cutoff"] = cutoff
        result = tx.exec_driver_sql(_PG_SEND, params)
        return {(q, mid) for q, mid in result.fetchall()}

    def _insert_sqlite(
        self, tx: Connection, unique: dict[tuple[str, str], Row], now: datetime, cutoff: datetime
    ) -> set[tuple[str, str]]:
        """An upsert of the ids that returns the fresh ones (a multi-row VALUES per chunk), then
        one ``executemany`` of the messages. Times go in as SQLAlchemy's own text encoding,
        computed once for the batch's shared ``now`` instead of once per row and column."""
        encode = self._sqlite_time(tx)
        now_s, cutoff_s = encode(now), encode(cutoff)
        keys = list(unique)
        fresh: set[tuple[str, str]] = set()
        for i in range(0, len(keys), _SQLITE_CHUNK):
            chunk = keys[i : i + _SQLITE_CHUNK]
            sql = _SQLITE_SEEN.format(values=", ".join(["(?, ?, ?)"] * len(chunk)))
            args = [v for q, mid in chunk for v in (q, mid, now_s)]
            args.append(cutoff_s)
            fresh.update((q, mid) for q, mid in tx.exec_driver_sql(sql, tuple(args)).fetchall())
        accepted = [  # the row with enqueued_at added and the times encoded
            (*r[:8], now_s, now_s if r[8] is now else encode(r[8]), r[9])
            for key, r in unique.items()
            if key in fresh
        ]
        if accepted:
            tx.exec_driver_sql(_SQLITE_INSERT, accepted)
        return fresh

    @staticmethod
    def _sqlite_time(tx: Connection) -> Callable[[datetime], Any]:
        process = M.c.enqueued_at.type.dialect_impl(tx.dialect).bind_processor(tx.dialect)
        assert process is not None  # SQLite stores datetimes as text
        return process

    def validate(self, queue: str, msg: QueueMessage) -> None:
        """See ``QueueSender.validate``."""
        self._rows([(queue, msg)], self._options.now())

    def _rows(
        self, entries: Sequence[tuple[str, QueueMessage]], now: datetime
    ) -> dict[tuple[str, str], Row]:
        """The batch's rows, the first of each ``(queue, message_id)``, validated in order.

        The common case (str ids, a bytes body, no headers, no schedule) is checked inline; any
        other value goes through ``validation``, which converts it or names the problem."""
        max_bytes = self._options.max_body_bytes
        queues: set[str] = set()
        out: dict[tuple[str, str], Row] = {}
        last_headers: dict[str, Any] | None = None
        last_encoded = "{}"
        for queue, msg in entries:
            if not isinstance(msg, QueueMessage):
                raise ValidationError(
                    f"expected a QueueMessage, got {type(msg).__name__}",
                    hint="wrap the payload: QueueMessage(body=...)",
                )
            if queue not in queues:
                queues.add(validation.queue_name(queue))
            mid = msg.message_id
            if type(mid) is not str or not mid or len(mid) > validation.MAX_ID:
                validation.identifier("message_id", mid)
            sid, cid = msg.session_id, msg.correlation_id
            if sid is not None and (type(sid) is not str or not sid or len(sid) > _MAX):
                validation.identifier("session_id", sid, optional=True)
            if cid is not None and (type(cid) is not str or not cid or len(cid) > _MAX):
                validation.identifier("correlation_id", cid, optional=True)
            when = validation.aware("not_before", msg.not_before)
            not_before = now if when is None else utc(when)
            body = msg.body
            if type(body) is not bytes or len(body) > max_bytes:
                body = validation.body(body, mid, max_bytes)
            headers = msg.headers
            if type(headers) is dict and not headers:
                encoded = "{}"  # most messages carry none: no JSON encoder for the empty dict
            elif type(headers) is dict and headers == last_headers:
                # a unit of work's messages carry one traceparent: equal to the previous
                # message's headers, which were validated and encoded already
                encoded = last_encoded
            else:
                encoded = validation.headers(headers, mid)
                if type(headers) is dict and all(type(v) is str for v in headers.values()):
                    # only text values: True == 1 would otherwise reuse "1" for true
                    last_headers, last_encoded = headers, encoded
            row: Row = (
                queue,
                mid,
                sid,
                body,
                msg.subject or "",
                msg.content_type or "",
                cid,
                encoded,
                not_before,
                # scheduled for later: not in its session until its time (docs/sql_queue.md)
                when is not None and not_before > now,
            )
            out.setdefault((queue, mid), row)
        return out

    def close(self) -> None:
        """Close the queue this sender belongs to (its parts share one connection pool)."""
        self._db.close()

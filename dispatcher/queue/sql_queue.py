"""A durable queue in SQL with Service Bus semantics: duplicate detection, scheduled delivery,
session FIFO with one lock holder per session, peek-lock settlement, delivery counts and dead
letters.

How it stays correct under concurrency:

* PostgreSQL: receivers pick candidates with ``FOR UPDATE SKIP LOCKED``, so they never wait for
  each other and never take the same row; senders of one session take an advisory lock so
  sequence order is commit order within a session (see ``rows.lock_sessions``).
* SQLite: every write transaction is ``BEGIN IMMEDIATE`` and short, so writers run one at a time
  (WAL lets readers go on).
* Sessions: only a session's *head* (its lowest sequence number) can be delivered, so while the
  head is locked nothing else of that session is, and order holds across redeliveries.

Every time comes from the injected clock and is stored as UTC.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from dispatcher.queue import dead_letter_admin, validation
from dispatcher.queue.database import Database, open_engine
from dispatcher.queue.messages import (
    DeadLetter,
    PeekedMessage,
    QueueMessage,
    QueueStats,
    ReceivedMessage,
    as_utc,
)
from dispatcher.queue.rows import lock_sessions, move_to_dead_letters, received
from migrations.sql.tables import dead_letters, duplicate_ids, queue_messages
from outbox.core.clock import Clock, SystemClock, utc
from outbox.core.errors import LockLostError, OutboxError, QueueError, ValidationError

log = logging.getLogger("outbox.queue")

M = queue_messages
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
#: At most this many expired duplicate-detection ids are deleted per cleanup (a short write).
DEDUP_CLEANUP_LIMIT = 5000
_MAX_RECEIVE = 1000

Settleable = ReceivedMessage | str


class SqlQueue:
    """A set of named queues in one SQL database (SQLite file or PostgreSQL).

    Queues need no creation: the first send to a valid name creates it. The instance is thread
    safe; use one per process and share it.
    """

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        clock: Clock | None = None,
        lock_duration: float = 30.0,
        max_delivery_count: int = 10,
        duplicate_detection_window: float = 600.0,
        max_body_bytes: int = 256 * 1024,
        check_schema: bool = True,
        pool_size: int | None = None,
    ) -> None:
        if not 0 < lock_duration <= 300:
            raise ValidationError(f"lock_duration {lock_duration!r}s must be in (0, 300]")
        validation.positive("max_delivery_count", max_delivery_count)
        validation.positive("max_body_bytes", max_body_bytes)
        if duplicate_detection_window < 0:
            raise ValidationError("duplicate_detection_window must not be negative")
        if isinstance(url_or_engine, str):
            self._db = Database(open_engine(url_or_engine, pool_size=pool_size), owned=True)
        else:
            self._db = Database(url_or_engine, owned=False)
        self.clock: Clock = clock or SystemClock()
        self.lock_duration = timedelta(seconds=lock_duration)
        self.max_delivery_count = max_delivery_count
        self.duplicate_detection_window = timedelta(seconds=duplicate_detection_window)
        self.max_body_bytes = max_body_bytes
        self._last_clean: datetime | None = None  # None: clean at the first chance
        self._clean_guard = threading.Lock()
        if check_schema:
            self._check_schema()

    @classmethod
    def from_settings(
        cls, settings: Any, *, clock: Clock | None = None, pool_size: int | None = None
    ) -> SqlQueue:
        """A queue configured from ``outbox.core.settings.Settings``."""
        return cls(
            settings.sql_url,
            clock=clock,
            lock_duration=settings.lock_duration,
            max_delivery_count=settings.max_delivery_count,
            duplicate_detection_window=settings.duplicate_detection_window,
            max_body_bytes=settings.max_message_bytes,
            pool_size=pool_size,
        )

    def ensure_pool_size(self, size: int) -> None:
        """Grow the connection pool to at least ``size`` (for a queue built from a URL; an engine
        passed in is the caller's). Calls in progress finish on their connections."""
        if not self._db.owned:
            return
        current = getattr(self._db.engine.pool, "size", None)
        if not callable(current) or current() >= size:
            return
        old = self._db.engine
        self._db.engine = open_engine(old.url.render_as_string(hide_password=False), pool_size=size)
        old.dispose()

    @property
    def engine(self) -> Engine:
        """The engine, for a consumer handler's own SQL work in the same transaction."""
        return self._db.engine

    @property
    def database(self) -> Database:
        return self._db

    def _now(self) -> datetime:
        return utc(self.clock.now())

    def _check_schema(self) -> None:
        from migrations.sql import current_revision, head_revision

        revision = current_revision(self._db.engine)
        if revision != head_revision():
            state = "is not migrated" if revision is None else f"is at revision {revision}"
            raise QueueError(
                f"the queue database {self._db.engine.url.render_as_string(hide_password=True)} "
                f"{state}; this version needs {head_revision()}",
                hint="run `outbox migrate`",
            )

    # --- sending ---------------------------------------------------------------------------

    def send(
        self,
        queue: str,
        messages: QueueMessage | Sequence[QueueMessage],
        *,
        conn: Connection | None = None,
    ) -> list[str]:
        """Store one message or an atomic batch; returns once committed.

        Returns the message ids actually enqueued: an id already seen on this queue within the
        duplicate-detection window is accepted and dropped (as Service Bus does).

        ``conn``: send inside that open transaction instead (a ``Consumer`` handler's connection):
        the messages commit or roll back with the handler's work.
        """
        batch = [messages] if isinstance(messages, QueueMessage) else list(messages)
        return self.send_batch([(queue, m) for m in batch], conn=conn)

    def send_batch(
        self, entries: Sequence[tuple[str, QueueMessage]], *, conn: Connection | None = None
    ) -> list[str]:
        """Like ``send`` but each message names its queue; the whole batch is one transaction."""
        now = self._now()
        rows = [self._row(queue, msg, now) for queue, msg in entries]
        unique: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            unique.setdefault((row["queue"], row["message_id"]), row)
        if not unique:
            return []
        cutoff = now - self.duplicate_detection_window
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
        if conn is None:  # never raises: the batch is already committed
            self.maybe_forget_expired_duplicates()
        return [row["message_id"] for row in accepted]

    def validate(self, queue: str, msg: QueueMessage) -> None:
        """Raise ``ValidationError`` if ``send(queue, msg)`` would refuse the message."""
        self._row(queue, msg, self._now())

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
            "body": validation.body(msg.body, message_id, self.max_body_bytes),
            "subject": msg.subject or "",
            "content_type": msg.content_type or "",
            "correlation_id": msg.correlation_id,
            "headers": validation.headers(msg.headers, message_id),
            "enqueued_at": now,
            "not_before": utc(not_before) if not_before is not None else now,
            "delivery_count": 0,
        }

    def forget_expired_duplicates(self, limit: int | None = DEDUP_CLEANUP_LIMIT) -> int:
        """Delete up to ``limit`` (None: all) duplicate-detection ids older than the window;
        returns how many. Sends call it through ``maybe_forget_expired_duplicates`` at most every
        half window; ``outbox maintain`` or an idle worker may call either."""
        with self._db.write("clean duplicate-detection ids") as conn:
            cutoff = self._now() - self.duplicate_detection_window
            expired = duplicate_ids.c.seen_at <= cutoff
            if limit is None:
                stmt = delete(duplicate_ids).where(expired)
            else:
                validation.positive("limit", limit)
                oldest = (
                    select(duplicate_ids.c.queue, duplicate_ids.c.message_id)
                    .where(expired)
                    .order_by(duplicate_ids.c.seen_at)
                    .limit(limit)
                )
                stmt = delete(duplicate_ids).where(
                    tuple_(duplicate_ids.c.queue, duplicate_ids.c.message_id).in_(oldest)
                )
            result = conn.execute(stmt)
        return int(result.rowcount)

    def maybe_forget_expired_duplicates(self) -> int:
        """``forget_expired_duplicates()`` when half a window has passed since the last cleanup
        by this instance (or it never ran). Never raises: a failed cleanup is logged and tried
        again next time. Returns how many ids were deleted."""
        now = self._now()
        due = (
            self._last_clean is None or now - self._last_clean > self.duplicate_detection_window / 2
        )
        if not due or not self._clean_guard.acquire(blocking=False):
            return 0
        try:
            deleted = self.forget_expired_duplicates()
        except OutboxError as e:
            log.warning("cleaning expired duplicate-detection ids failed (retried later): %s", e)
            return 0
        finally:
            self._clean_guard.release()
        self._last_clean = now
        return deleted

    # --- receiving -------------------------------------------------------------------------

    def _deliverable(
        self, queue: str, now: datetime, session_id: str | None
    ) -> list[ColumnElement[bool]]:
        earlier = M.alias("earlier")
        head_of_session = ~exists().where(
            earlier.c.queue == M.c.queue,
            earlier.c.session_id == M.c.session_id,
            earlier.c.sequence_number < M.c.sequence_number,
        )
        conditions: list[ColumnElement[bool]] = [
            M.c.queue == queue,
            M.c.not_before <= now,
            or_(M.c.locked_until.is_(None), M.c.locked_until <= now),
        ]
        if session_id is None:
            conditions.append(or_(M.c.session_id.is_(None), head_of_session))
        else:
            conditions += [M.c.session_id == session_id, head_of_session]
        return conditions

    def _exhausted_description(self) -> str:
        return f"delivered {self.max_delivery_count} times without completion"

    def _anything_deliverable(self, queue: str, now: datetime, session_id: str | None) -> bool:
        with self._db.read("receive messages") as conn:
            probe = select(M.c.sequence_number).where(*self._deliverable(queue, now, session_id))
            return conn.execute(probe.limit(1)).first() is not None

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Lock and return up to ``max_messages`` deliverable messages (peek-lock).

        At most one message per session is returned, and none of a session whose head is locked.
        Messages delivered ``max_delivery_count`` times already go to dead letters instead.
        """
        return self._take(queue, max_messages, session_id, lock=True)

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Remove and return messages at once: lost if the caller then fails (low-value data)."""
        return self._take(queue, max_messages, session_id, lock=False)

    def _take(
        self, queue: str, max_messages: int, session_id: str | None, *, lock: bool
    ) -> list[ReceivedMessage]:
        validation.queue_name(queue)
        validation.positive("max_messages", max_messages)
        validation.identifier("session_id", session_id, optional=True)
        max_messages = min(max_messages, _MAX_RECEIVE)
        out: list[ReceivedMessage] = []
        if not self._db.postgres and not self._anything_deliverable(queue, self._now(), session_id):
            return out  # an idle poll never takes SQLite's write lock
        with self._db.write("receive messages") as conn:
            now = self._now()  # after waiting for the write lock: lock expiries start from here
            for _ in range(10):  # each round may dead-letter exhausted heads and uncover more
                stmt = (
                    select(M)
                    .where(*self._deliverable(queue, now, session_id))
                    .order_by(M.c.sequence_number)
                    .limit(max_messages - len(out))
                )
                if self._db.postgres:
                    stmt = stmt.with_for_update(skip_locked=True, of=M)
                rows = conn.execute(stmt).mappings().all()
                exhausted = [
                    r["sequence_number"]
                    for r in rows
                    if r["delivery_count"] >= self.max_delivery_count
                ]
                move_to_dead_letters(
                    conn,
                    exhausted,
                    reason=MAX_DELIVERY_REASON,
                    description=self._exhausted_description(),
                    now=now,
                )
                live = [r for r in rows if r["delivery_count"] < self.max_delivery_count]
                if lock:
                    until = now + self.lock_duration
                    tokens = [str(uuid.uuid4()) for _ in live]
                    if live:  # one executemany, one cached statement, for the whole batch
                        conn.execute(
                            update(M)
                            .where(M.c.sequence_number == bindparam("b_seq"))
                            .values(
                                lock_token=bindparam("b_token"),
                                locked_until=until,
                                delivery_count=M.c.delivery_count + 1,
                            ),
                            [
                                {"b_seq": row["sequence_number"], "b_token": token}
                                for row, token in zip(live, tokens, strict=True)
                            ],
                        )
                    out += [
                        received(row, lock_token=token, locked_until=until)
                        for row, token in zip(live, tokens, strict=True)
                    ]
                elif live:
                    seqs = [r["sequence_number"] for r in live]
                    conn.execute(delete(M).where(M.c.sequence_number.in_(seqs)))
                    out += [received(r, lock_token=None, locked_until=None) for r in live]
                if not exhausted or len(out) >= max_messages:
                    break
        return out

    # --- settling --------------------------------------------------------------------------

    def _locked_by(self, target: Settleable, now: datetime) -> tuple[ColumnElement[bool], str]:
        """The WHERE clause matching the message only while ``target``'s lock is valid."""
        if isinstance(target, ReceivedMessage):
            if target.lock_token is None:
                raise ValidationError(
                    f"message {target.message_id} came from receive_and_delete and has no lock",
                    hint="use receive() (peek-lock) for messages you want to settle",
                )
            token = validation.lock_token(target.lock_token)
            clause = and_(M.c.sequence_number == target.sequence_number, M.c.lock_token == token)
            label = f"message {target.message_id}"
        else:
            token = validation.lock_token(target)
            clause = M.c.lock_token == token
            label = f"lock token {token}"
        return and_(clause, M.c.locked_until > now), label

    @staticmethod
    def _lost(label: str) -> LockLostError:
        return LockLostError(
            f"{label}: the lock expired or belongs to another receiver; nothing changed",
            hint="the message will be (or was) redelivered; settle within lock_duration or "
            "call renew_lock",
        )

    def complete(self, target: Settleable) -> None:
        """Remove a locked message: it was handled."""
        with self._db.write("complete a message") as conn:
            where, label = self._locked_by(target, self._now())
            if conn.execute(delete(M).where(where)).rowcount != 1:
                raise self._lost(label)

    def abandon(self, target: Settleable, delay: float = 0) -> None:
        """Release the lock so the message is delivered again, after ``delay`` seconds.

        A message already delivered ``max_delivery_count`` times goes to dead letters instead.
        """
        delay = validation.delay(delay)
        with self._db.write("abandon a message") as conn:
            now = self._now()
            where, label = self._locked_by(target, now)
            row = self._select_locked(conn, where)
            if row is None:
                raise self._lost(label)
            seq = int(row.sequence_number)
            if row.delivery_count >= self.max_delivery_count:
                move_to_dead_letters(
                    conn,
                    [seq],
                    reason=MAX_DELIVERY_REASON,
                    description=self._exhausted_description(),
                    now=now,
                )
                return
            conn.execute(
                update(M)
                .where(M.c.sequence_number == seq)
                .values(
                    lock_token=None, locked_until=None, not_before=now + timedelta(seconds=delay)
                )
            )

    def dead_letter(self, target: Settleable, reason: str, description: str = "") -> None:
        """Move a locked message to dead letters with a reason (a poison message)."""
        if not isinstance(reason, str) or not reason or len(reason) > 256:
            raise ValidationError(f"invalid dead-letter reason {reason!r}", hint="1-256 chars")
        with self._db.write("dead-letter a message") as conn:
            now = self._now()
            where, label = self._locked_by(target, now)
            row = self._select_locked(conn, where)
            if row is None:
                raise self._lost(label)
            move_to_dead_letters(
                conn, [int(row.sequence_number)], reason=reason, description=description, now=now
            )

    def renew_lock(self, target: Settleable) -> datetime:
        """Extend the lock by ``lock_duration`` from now; returns the new expiry."""
        with self._db.write("renew a lock") as conn:
            now = self._now()  # read once the write lock is ours: waiting for it takes time
            where, label = self._locked_by(target, now)
            until = now + self.lock_duration
            if conn.execute(update(M).where(where).values(locked_until=until)).rowcount != 1:
                raise self._lost(label)
        return until

    def _select_locked(self, conn: Any, where: ColumnElement[bool]) -> Any:
        stmt = select(M.c.sequence_number, M.c.delivery_count).where(where)
        if self._db.postgres:
            stmt = stmt.with_for_update()
        return conn.execute(stmt).first()

    # --- looking -------------------------------------------------------------------------

    def peek(self, queue: str, limit: int = 10) -> list[PeekedMessage]:
        """Messages in sequence (FIFO) order, without locking or removing them."""
        validation.queue_name(queue)
        validation.positive("limit", limit)
        now = self._now()
        with self._db.read("peek messages") as conn:
            rows = conn.execute(
                select(M).where(M.c.queue == queue).order_by(M.c.sequence_number).limit(limit)
            ).mappings()
            out = []
            for r in rows:
                locked_until = as_utc(r["locked_until"])
                not_before = as_utc(r["not_before"])
                assert not_before is not None
                if locked_until is not None and locked_until > now:
                    state = "locked"
                elif not_before > now:
                    state = "scheduled"
                else:
                    state = "active"
                out.append(
                    PeekedMessage(
                        queue=r["queue"],
                        message_id=r["message_id"],
                        sequence_number=int(r["sequence_number"]),
                        session_id=r["session_id"],
                        state=state,
                        delivery_count=int(r["delivery_count"]),
                        enqueued_at=as_utc(r["enqueued_at"]) or now,
                        not_before=not_before,
                        locked_until=locked_until,
                        subject=r["subject"],
                        content_type=r["content_type"],
                        body=bytes(r["body"]),
                    )
                )
        return out

    def stats(self, queue: str | None = None) -> dict[str, QueueStats]:
        """Depth per queue (or of ``queue`` only): active, scheduled, locked and dead-lettered.

        Queues that hold nothing (no messages, no dead letters) are not listed."""
        if queue is not None:
            validation.queue_name(queue)
        now = self._now()
        is_locked = and_(M.c.locked_until.is_not(None), M.c.locked_until > now)
        live_stmt = select(
            M.c.queue,
            func.count().label("total"),
            func.sum(case((is_locked, 1), else_=0)).label("locked"),
            func.sum(case((and_(~is_locked, M.c.not_before > now), 1), else_=0)).label("scheduled"),
        ).group_by(M.c.queue)
        dead_stmt = select(dead_letters.c.queue, func.count()).group_by(dead_letters.c.queue)
        if queue is not None:
            live_stmt = live_stmt.where(M.c.queue == queue)
            dead_stmt = dead_stmt.where(dead_letters.c.queue == queue)
        with self._db.read("read queue stats") as conn:
            live = conn.execute(live_stmt).all()
            dead = conn.execute(dead_stmt).all()
        out: dict[str, QueueStats] = {}
        for name, total, locked_raw, scheduled_raw in live:
            locked, scheduled = int(locked_raw or 0), int(scheduled_raw or 0)
            out[name] = QueueStats(
                name, active=int(total) - locked - scheduled, scheduled=scheduled, locked=locked
            )
        for name, count in dead:
            base = out.get(name, QueueStats(name))
            out[name] = QueueStats(
                name, base.active, base.scheduled, base.locked, dead_lettered=int(count)
            )
        return dict(sorted(out.items()))

    # --- dead letters ----------------------------------------------------------------------

    def list_dead_letters(
        self, queue: str | None = None, limit: int = 100, *, where: Mapping[str, str] | None = None
    ) -> list[DeadLetter]:
        """Dead letters, oldest first, optionally of one queue and matching ``where``."""
        return dead_letter_admin.list_(self._db, queue, limit, where)

    def get_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        return dead_letter_admin.get(self._db, dead_letter_id)

    def count_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
    ) -> int:
        """How many dead letters a requeue or purge with these arguments would touch."""
        return dead_letter_admin.count(self._db, ids, where, all)

    def requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Put dead letters back on their queues with the same message_id and a delivery count
        of 0. Give ids, a ``where`` filter (queue, reason, session_id, message_id, subject), or
        ``all=True``. Returns how many moved."""
        return dead_letter_admin.requeue(
            self._db, self._now(), ids=ids, where=where, everything=all, on_progress=on_progress
        )

    def purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: Mapping[str, str] | None = None,
        all: bool = False,
        on_progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete dead letters for good (same selection as ``requeue``). Returns how many."""
        return dead_letter_admin.purge(self._db, ids, where, all, on_progress)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections; any later call raises ``ClosedError``."""
        self._db.close()

    def __enter__(self) -> SqlQueue:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

"""The queue's receiver: receive (peek-lock) or receive-and-delete, settle (complete, abandon,
dead-letter), renew locks, and peek.

How receiving stays correct under concurrency:

* PostgreSQL: receivers pick candidates with ``FOR UPDATE SKIP LOCKED``, so they never wait for
  each other and never take the same row.
* SQLite: every write transaction is ``BEGIN IMMEDIATE`` and short, so writers run one at a time
  (WAL lets readers go on); an idle poll only reads, and never takes the write lock.
* Sessions: only a session's *head* (its lowest sequence number) can be delivered, and nothing of
  a session while any of its messages is locked, so it has one holder and order holds across
  redeliveries. Deferred messages, and scheduled ones before their time, are not in the line.
* Defer: a deferred message keeps its row (and delivery count) but leaves the line; it comes back
  only through ``receive_deferred`` by sequence number, locked like any received message.

A settlement matches the row only while the caller's lock is valid (same token, not expired), so
a receiver whose lock ran out gets ``LockLostError`` and changes nothing.

Why one module: receiving, the four settlements and receiving deferred messages share one rule of
what a valid lock is, one rule of what a session's line is and one delivery step (``_deliver``:
dead-letter the exhausted, lock the rest); apart, each would restate them. The statements
themselves (what is deliverable, the settling and locking SQL) are in ``receive_statements``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    Select,
    and_,
    delete,
    or_,
    select,
    update,
)

from dispatcher.queue import validation
from dispatcher.queue.database import Database
from dispatcher.queue.messages import PeekedMessage, ReceivedMessage
from dispatcher.queue.options import QueueOptions
from dispatcher.queue.ports import Settleable
from dispatcher.queue.receive_statements import (
    COMPLETE_MANY_PG,
    complete_many_sqlite,
    driver_sql,
    receive_statement,
)
from dispatcher.queue.rows import (
    DELIVERIES,
    SEQ,
    lock_tokens,
    move_to_dead_letters,
    peeked,
    received_rows,
)
from migrations.sql.tables import queue_messages
from outbox.core.errors import LockLostError, MessageNotFoundError, ValidationError

M = queue_messages


def _identity(value: datetime) -> Any:
    return value


#: The dead-letter reason of a message delivered ``max_delivery_count`` times.
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
_MAX_RECEIVE = 1000
#: The most messages one completion statement takes (SQLite binds three parameters each).
_MAX_COMPLETE = 1000


class SqlQueueReceiver:
    """The ``QueueReceiver`` of one ``SqlQueue`` (thread safe, like the queue)."""

    def __init__(self, db: Database, options: QueueOptions) -> None:
        self._db = db
        self._options = options
        # The hot statements as the driver's own SQL, so a settlement skips SQLAlchemy's
        # statement building, cache-key walk and parameter processing (docs/performance-queue.md).
        self._sql = driver_sql(postgres=db.postgres)
        self._encode_time: Callable[[datetime], Any] = _identity
        if not db.postgres:
            process = M.c.locked_until.type.dialect_impl(db.engine.dialect).bind_processor(
                db.engine.dialect
            )
            assert process is not None  # SQLite stores datetimes as text
            self._encode_time = process
        self._statements: dict[tuple[str, bool, int], Select[Any]] = {}
        self._complete_many: dict[int, str] = {}  # SQLite's, by batch size

    @property
    def lock_duration(self) -> timedelta:
        return self._options.lock_duration

    @property
    def max_delivery_count(self) -> int:
        return self._options.max_delivery_count

    # --- receiving -------------------------------------------------------------------------

    def _statement(self, kind: str, by_session: bool, limit: int) -> Select[Any]:
        """The receive's SELECT (``take``) or SQLite's idle probe (``probe``), cached by shape."""
        key = (kind, by_session, limit)
        stmt = self._statements.get(key)
        if stmt is None:
            stmt = receive_statement(kind, by_session, limit, postgres=self._db.postgres)
            self._statements[key] = stmt  # a race builds it twice; both are the same
        return stmt

    @staticmethod
    def _params(queue: str, now: datetime, session_id: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"queue": queue, "now": now}
        if session_id is not None:
            params["session_id"] = session_id
        return params

    def _exhausted_description(self) -> str:
        return f"delivered {self._options.max_delivery_count} times without completion"

    def _anything_deliverable(self, queue: str, now: datetime, session_id: str | None) -> bool:
        with self._db.read("receive messages") as conn:
            probe = self._statement("probe", session_id is not None, 1)
            return conn.execute(probe, self._params(queue, now, session_id)).first() is not None

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """See ``QueueReceiver.receive``."""
        return self._take(queue, max_messages, session_id, lock=True)

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """See ``QueueReceiver.receive_and_delete``."""
        return self._take(queue, max_messages, session_id, lock=False)

    def _take(
        self, queue: str, max_messages: int, session_id: str | None, *, lock: bool
    ) -> list[ReceivedMessage]:
        validation.queue_name(queue)
        validation.positive("max_messages", max_messages)
        validation.identifier("session_id", session_id, optional=True)
        max_messages = min(max_messages, _MAX_RECEIVE)
        out: list[ReceivedMessage] = []
        if not self._db.postgres and not self._anything_deliverable(
            queue, self._options.now(), session_id
        ):
            return out  # an idle poll never takes SQLite's write lock
        with self._db.write("receive messages") as conn:
            if self._db.postgres:
                conn.exec_driver_sql(self._sql["plan_pg"])
            now = self._options.now()  # after waiting for the write lock: expiries start here
            for _ in range(10):  # each round may dead-letter exhausted heads and uncover more
                stmt = self._statement("take", session_id is not None, max_messages - len(out))
                params = self._params(queue, now, session_id)
                rows = conn.execute(stmt, params).all()
                got, exhausted = self._deliver(conn, rows, now, lock=lock)
                out += got
                if not exhausted or len(out) >= max_messages:
                    break
        return out

    def _deliver(
        self, conn: Connection, rows: Sequence[Row[Any]], now: datetime, *, lock: bool
    ) -> tuple[list[ReceivedMessage], bool]:
        """Hand ``rows`` out, the one step of every receive (``receive``, ``receive_and_delete``
        and ``receive_deferred``): dead-letter those delivered ``max_delivery_count`` times, then
        lock the rest (or delete them: ``lock=False``). Also says whether any was dead-lettered
        (each may have been a session's head, hiding the next message)."""
        max_deliveries = self._options.max_delivery_count
        exhausted = [r[SEQ] for r in rows if r[DELIVERIES] >= max_deliveries]
        move_to_dead_letters(
            conn,
            exhausted,
            reason=MAX_DELIVERY_REASON,
            description=self._exhausted_description(),
            now=now,
        )
        live = [r for r in rows if r[DELIVERIES] < max_deliveries] if exhausted else rows
        seqs = [r[SEQ] for r in live]
        if not lock:
            if live:
                conn.execute(delete(M).where(M.c.sequence_number.in_(seqs)))
            return received_rows(live, [None] * len(live), None), bool(exhausted)
        until = now + self._options.lock_duration
        tokens = lock_tokens(len(live))
        if live:
            self._lock_rows(conn, seqs, tokens, until, now)
        return received_rows(live, tokens, until), bool(exhausted)

    # --- settling --------------------------------------------------------------------------

    @staticmethod
    def _lost_in(conn: Connection, params: dict[str, Any], label: str) -> LockLostError:
        """Why a settlement matched no row, read from the row as it is now (only on this failure
        path): gone (settled already: a second ``complete`` used to be told its lock expired),
        still under this lock but expired, or under another receiver's lock."""
        token = params["token"]
        if "seq" not in params:  # a bare lock token: its message cannot be looked up otherwise
            return LockLostError(
                f"{label}: no message holds this lock any more (it was settled already, or the "
                "lock ran out and the message was received again); nothing changed",
                hint="settle each received message once, within lock_duration (or renew_lock)",
            )
        row = conn.execute(
            select(M.c.lock_token).where(M.c.sequence_number == params["seq"])
        ).first()
        if row is None:
            return LockLostError(
                f"{label}: it is no longer in the queue: it was settled already (completed or "
                "dead-lettered, by this receiver or by another after this lock ran out); nothing "
                "changed",
                hint="settle each received message once",
            )
        if row.lock_token == token:
            why = "its lock expired"
        else:
            why = "its lock ran out and it went back to the queue or to another receiver"
        return LockLostError(
            f"{label}: {why}; nothing changed",
            hint="the message will be (or was) redelivered; settle within lock_duration or "
            "call renew_lock",
        )

    def complete(self, target: Settleable) -> None:
        """See ``QueueReceiver.complete``."""
        params, label = self._lock_params(target)
        with self._db.statement("complete a message") as conn:
            params["now"] = self._encode_time(self._options.now())
            sql = self._sql["complete_token" if "seq" not in params else "complete"]
            if conn.exec_driver_sql(sql, params).rowcount != 1:
                raise self._lost_in(conn, params, label)

    def complete_many(self, messages: Sequence[ReceivedMessage]) -> set[int]:
        """Complete ``messages`` (each from ``receive``, so with a lock token), each only while
        its own lock is valid, in one statement per ``_MAX_COMPLETE``; the sequence numbers of
        those completed. One missing from the answer lost its lock meanwhile and is left as it
        is (redelivered), as ``complete`` would have refused it; nothing is raised for it."""
        done: set[int] = set()
        for i in range(0, len(messages), _MAX_COMPLETE):
            chunk = messages[i : i + _MAX_COMPLETE]
            seqs = [m.sequence_number for m in chunk]
            tokens = [m.lock_token for m in chunk]
            with self._db.statement("complete messages") as conn:
                now = self._encode_time(self._options.now())
                if self._db.postgres:
                    params: Any = {"seqs": seqs, "tokens": tokens, "now": now}
                    sql = COMPLETE_MANY_PG
                else:
                    sql = self._complete_many.get(len(chunk)) or complete_many_sqlite(len(chunk))
                    self._complete_many[len(chunk)] = sql
                    pairs = [v for pair in zip(seqs, tokens, strict=True) for v in pair]
                    params = (*seqs, now, *pairs)
                done.update(int(r[0]) for r in conn.exec_driver_sql(sql, params).all())
        return done

    def complete_in(self, conn: Connection, msg: ReceivedMessage, now: datetime) -> bool:
        """``complete`` in the caller's transaction, with the lock valid at ``now``; False when
        it was lost. A ``Connection`` handler's work and its completion commit together so."""
        params, _ = self._lock_params(msg)
        params["now"] = self._encode_time(now)
        return bool(conn.exec_driver_sql(self._sql["complete"], params).rowcount == 1)

    def abandon(self, target: Settleable, delay: float = 0) -> None:
        """See ``QueueReceiver.abandon``."""
        delay = validation.delay(delay)
        self._release(
            target,
            "abandon a message",
            lambda now: {
                "not_before": now + timedelta(seconds=delay),
                "scheduled": False,  # a retry's delay holds its session (docs/sql_queue.md)
            },
        )

    def defer(self, target: Settleable) -> None:
        """See ``DeferringReceiver.defer``; at ``max_delivery_count`` it dead-letters, as an
        abandon does (and as Service Bus does)."""
        self._release(target, "defer a message", lambda now: {"deferred": True})

    def _release(
        self, target: Settleable, what: str, values: Callable[[datetime], dict[str, Any]]
    ) -> None:
        """Unlock ``target`` and set ``values(now)`` on it; a message delivered
        ``max_delivery_count`` times is dead-lettered instead."""
        with self._db.write(what) as conn:
            now = self._options.now()
            seq, delivery_count = self._select_locked(conn, target, now)
            if delivery_count >= self._options.max_delivery_count:
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
                .values(lock_token=None, locked_until=None, **values(now))
            )

    def dead_letter(self, target: Settleable, reason: str, description: str = "") -> None:
        """See ``QueueReceiver.dead_letter``."""
        if not isinstance(reason, str) or not reason or len(reason) > 256:
            raise ValidationError(f"invalid dead-letter reason {reason!r}", hint="1-256 chars")
        with self._db.write("dead-letter a message") as conn:
            now = self._options.now()
            seq, _ = self._select_locked(conn, target, now)
            move_to_dead_letters(conn, [seq], reason=reason, description=description, now=now)

    def receive_deferred(
        self,
        queue: str,
        sequence_numbers: int | Sequence[int],
        *,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """See ``DeferringReceiver.receive_deferred``."""
        validation.queue_name(queue)
        validation.identifier("session_id", session_id, optional=True)
        wanted = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        seqs = sorted({validation.positive("sequence number", n) for n in wanted})
        if not seqs:
            return []
        with self._db.write("receive deferred messages") as conn:
            now = self._options.now()
            stmt = select(M).where(
                M.c.queue == queue,
                M.c.sequence_number.in_(seqs),
                M.c.deferred,
                or_(M.c.locked_until.is_(None), M.c.locked_until <= now),
            )
            if session_id is not None:
                stmt = stmt.where(M.c.session_id == session_id)
            if self._db.postgres:
                stmt = stmt.with_for_update(skip_locked=True)
            rows = conn.execute(stmt.order_by(M.c.sequence_number)).all()
            missing = sorted(set(seqs) - {int(r[SEQ]) for r in rows})
            if missing:
                raise MessageNotFoundError(
                    f"queue {queue}: no deferred message with sequence number(s) "
                    f"{', '.join(map(str, missing))} is free to receive",
                    hint="it was settled, is not deferred, or another receiver holds it "
                    "(see `outbox queue peek --deferred`)",
                )
            out, _ = self._deliver(conn, rows, now, lock=True)
        return out

    def renew_lock(self, target: Settleable) -> datetime:
        """See ``QueueReceiver.renew_lock``."""
        params, label = self._lock_params(target)
        with self._db.statement("renew a lock") as conn:
            now = self._options.now()  # read once the write lock is ours: waiting takes time
            until = now + self._options.lock_duration
            params["now"] = self._encode_time(now)
            params["until"] = self._encode_time(until)
            sql = self._sql["renew_token" if "seq" not in params else "renew"]
            if conn.exec_driver_sql(sql, params).rowcount != 1:
                raise self._lost_in(conn, params, label)
        return until

    def _lock_params(self, target: Settleable) -> tuple[dict[str, Any], str]:
        """The lock ``target`` names, as the statements' parameters (``seq`` only for a message)."""
        if isinstance(target, ReceivedMessage):
            if target.lock_token is None:
                raise ValidationError(
                    f"message {target.message_id} came from receive_and_delete and has no lock",
                    hint="use receive() (peek-lock) for messages you want to settle",
                )
            token = validation.lock_token(target.lock_token)
            params = {"seq": target.sequence_number, "token": token}
            return params, f"message {target.message_id}"
        token = validation.lock_token(target)
        return {"token": token}, f"lock token {token}"

    def _lock_rows(
        self, conn: Connection, seqs: list[int], tokens: list[str], until: datetime, now: datetime
    ) -> None:
        """Lock the received rows: one statement on PostgreSQL (the batch as two arrays), one
        ``executemany`` on SQLite (no round trips to save there)."""
        if self._db.postgres:
            conn.exec_driver_sql(
                self._sql["lock_pg"], {"seqs": seqs, "tokens": tokens, "until": until, "at": now}
            )
        else:
            end, at = self._encode_time(until), self._encode_time(now)
            conn.exec_driver_sql(
                self._sql["lock_sqlite"],
                [
                    {"seq": seq, "token": t, "until": end, "at": at}
                    for seq, t in zip(seqs, tokens, strict=True)
                ],
            )

    def _select_locked(
        self, conn: Connection, target: Settleable, now: datetime
    ) -> tuple[int, int]:
        """(sequence_number, delivery_count) of ``target`` while its lock is valid at ``now``
        (same token, not expired), else ``LockLostError``."""
        params, label = self._lock_params(target)
        clause = M.c.lock_token == params["token"]
        if "seq" in params:
            clause = and_(M.c.sequence_number == params["seq"], clause)
        stmt = select(M.c.sequence_number, M.c.delivery_count).where(clause, M.c.locked_until > now)
        if self._db.postgres:
            stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        if row is None:
            raise self._lost_in(conn, params, label)
        return int(row.sequence_number), int(row.delivery_count)

    # --- looking ---------------------------------------------------------------------------

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        """See ``QueueReceiver.peek``; ``deferred=True`` shows only deferred messages."""
        return self._peek(queue, limit, deferred=deferred, session_id=None)

    def peek_session(self, queue: str, session_id: str, limit: int = 10) -> list[PeekedMessage]:
        """``peek`` of one session's messages (``outbox devices show``: one device's tasks)."""
        return self._peek(queue, limit, deferred=False, session_id=session_id)

    def _peek(
        self, queue: str, limit: int, *, deferred: bool, session_id: str | None
    ) -> list[PeekedMessage]:
        validation.queue_name(queue)
        validation.positive("limit", limit)
        validation.identifier("session_id", session_id, optional=True)
        now = self._options.now()
        stmt = select(M).where(M.c.queue == queue)
        if deferred:
            stmt = stmt.where(M.c.deferred)
        if session_id is not None:
            stmt = stmt.where(M.c.session_id == session_id)
        with self._db.read("peek messages") as conn:
            rows = conn.execute(stmt.order_by(M.c.sequence_number).limit(limit)).mappings()
            return [peeked(r, now) for r in rows]

    def close(self) -> None:
        """Close the queue this receiver belongs to (its parts share one connection pool)."""
        self._db.close()

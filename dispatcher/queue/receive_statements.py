"""The receiver's statements: what may be delivered now (a session's line, paused sessions,
schedules, locks), the receive's SELECT built from it, and the settling and locking statements
as the driver's own SQL.

Why apart from ``receiver.py``: these say *what* a receive and a settlement are, as SQL, once;
``SqlQueueReceiver`` decides when to run them and what their answers mean (a lost lock, an
exhausted message). The receiver builds each shape once and caches it (docs/performance-queue.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, bindparam, exists, or_, select

from migrations.sql.tables import queue_messages, queue_sessions

M = queue_messages
S = queue_sessions

# Settling and locking as the driver's SQL; ``{name}`` becomes the dialect's placeholder. A lock
# is valid while its token matches and it has not expired (as the receiver's
# ``_select_locked`` says).
SQL = {
    "complete": "DELETE FROM outbox_queue_messages WHERE sequence_number = {seq} "
    "AND lock_token = {token} AND locked_until > {now}",
    "complete_token": "DELETE FROM outbox_queue_messages WHERE lock_token = {token} "
    "AND locked_until > {now}",
    "renew": "UPDATE outbox_queue_messages SET locked_until = {until} "
    "WHERE sequence_number = {seq} AND lock_token = {token} AND locked_until > {now}",
    "renew_token": "UPDATE outbox_queue_messages SET locked_until = {until} "
    "WHERE lock_token = {token} AND locked_until > {now}",
    "lock_pg": "UPDATE outbox_queue_messages AS m SET lock_token = t.token, "
    "locked_until = {until}, locked_at = {at}, delivery_count = m.delivery_count + 1 "
    "FROM unnest({seqs}::bigint[], {tokens}::varchar[]) AS t(seq, token) "
    "WHERE m.sequence_number = t.seq",
    # The receive's plan, pinned: a walk of the receive index in order, stopping at the limit.
    # A queue table's statistics are from whenever autovacuum last analyzed it, often nearly
    # empty; with them the planner reads every row of the queue and sorts them for each receive,
    # so a backlog drains in quadratic time (docs/performance-queue.md).
    "plan_pg": "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; "
    "SET LOCAL enable_sort = off",
    "lock_sqlite": "UPDATE outbox_queue_messages SET lock_token = {token}, "
    "locked_until = {until}, locked_at = {at}, delivery_count = delivery_count + 1 "
    "WHERE sequence_number = {seq}",
}


# Completing a batch of messages, each under its own lock, in ONE statement that says which rows
# went (``RETURNING``): the consumer's completer flushes with it (``completer``). A message whose
# lock was lost meanwhile is simply not among them. PostgreSQL takes the batch as two arrays.
COMPLETE_MANY_PG = (
    "DELETE FROM outbox_queue_messages AS m "
    "USING unnest(%(seqs)s::bigint[], %(tokens)s::varchar[]) AS t(seq, token) "
    "WHERE m.sequence_number = t.seq AND m.lock_token = t.token AND m.locked_until > %(now)s "
    "RETURNING m.sequence_number"
)


def complete_many_sqlite(n: int) -> str:
    """SQLite's ``COMPLETE_MANY_PG`` for ``n`` messages, positional: the ``n`` sequence numbers,
    the time, then the ``n`` (sequence number, token) pairs. The plain ``IN`` list walks the
    primary key; the pairs check each row's own token (``RETURNING`` needs SQLite 3.35)."""
    marks = ", ".join(["?"] * n)
    pairs = ", ".join(["(?, ?)"] * n)
    return (
        f"DELETE FROM outbox_queue_messages WHERE sequence_number IN ({marks}) "
        f"AND locked_until > ? AND (sequence_number, lock_token) IN (VALUES {pairs}) "
        "RETURNING sequence_number"
    )


class _Marks(dict[str, str]):
    """Placeholders for ``str.format_map``: each ``{name}`` becomes the dialect's marker."""

    def __init__(self, mark: Callable[[str], str]) -> None:
        super().__init__()
        self._mark = mark

    def __missing__(self, key: str) -> str:
        return self._mark(key)


def driver_sql(*, postgres: bool) -> dict[str, str]:
    """``SQL`` with each ``{name}`` as the dialect's placeholder."""
    mark: Callable[[str], str] = (lambda n: f"%({n})s") if postgres else (lambda n: f":{n}")
    return {name: sql.format_map(_Marks(mark)) for name, sql in SQL.items()}


def deliverable(by_session: bool) -> list[ColumnElement[bool]]:
    """What may be delivered now from queue ``:queue`` (of session ``:session_id`` when
    ``by_session``), with the time as parameter ``:now``: built once per shape, since
    building it (an alias, its column collection, a dozen expressions) cost about a quarter
    of a receive's client CPU per message (docs/performance-queue.md)."""
    other = M.alias("other")
    now = bindparam("now", type_=M.c.not_before.type)
    # A session is delivered from its head, to one holder: nothing of it is delivered while
    # an earlier message waits or any of its messages is locked. Two kinds of earlier message
    # are not in the session's line: a deferred one (set aside until asked for by number)
    # and a scheduled one before its time (as on Service Bus; an abandon's delay is not a
    # schedule and does hold the session).
    earlier_in_line = and_(
        other.c.sequence_number < M.c.sequence_number,
        ~other.c.deferred,
        ~and_(other.c.scheduled, other.c.not_before > now),
    )
    held = and_(other.c.locked_until.is_not(None), other.c.locked_until > now)
    session_free = ~exists().where(
        other.c.queue == M.c.queue,
        other.c.session_id == M.c.session_id,
        other.c.sequence_number != M.c.sequence_number,
        or_(earlier_in_line, held),
    )
    # A paused session (an offline device's) is out of the line until it is resumed: one
    # primary-key probe per candidate, on the session's own row.
    not_paused = ~exists().where(
        S.c.queue == M.c.queue, S.c.session_id == M.c.session_id, S.c.paused
    )
    session_free = and_(session_free, not_paused)
    conditions: list[ColumnElement[bool]] = [
        M.c.queue == bindparam("queue", type_=M.c.queue.type),
        ~M.c.deferred,
        M.c.not_before <= now,
        or_(M.c.locked_until.is_(None), M.c.locked_until <= now),
    ]
    if by_session:
        session = bindparam("session_id", type_=M.c.session_id.type)
        conditions += [M.c.session_id == session, session_free]
    else:
        conditions.append(or_(M.c.session_id.is_(None), session_free))
    return conditions


def receive_statement(kind: str, by_session: bool, limit: int, *, postgres: bool) -> Select[Any]:
    """The receive's SELECT (``take``: up to ``limit`` rows in order, locked and skipping locked
    rows on PostgreSQL) or SQLite's idle probe (``probe``: is anything deliverable)."""
    if kind == "probe":
        return select(M.c.sequence_number).where(*deliverable(by_session)).limit(1)
    stmt = select(M).where(*deliverable(by_session)).order_by(M.c.sequence_number).limit(limit)
    if postgres:
        stmt = stmt.with_for_update(skip_locked=True, of=M)
    return stmt

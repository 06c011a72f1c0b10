"""Row <-> dataclass mapping and the statements several queue operations share (moving rows to
dead letters, serializing a session's senders on PostgreSQL)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, DateTime, RowMapping, String, Text, delete, func, insert, literal
from sqlalchemy import select as sa_select

from dispatcher.queue.messages import DeadLetter, PeekedMessage, ReceivedMessage, as_utc
from migrations.sql.tables import dead_letters, queue_messages

M = queue_messages
D = dead_letters

#: The columns a message keeps when it moves to dead letters and back.
COPIED_COLUMNS = (
    "queue",
    "message_id",
    "session_id",
    "body",
    "subject",
    "content_type",
    "correlation_id",
    "headers",
    "enqueued_at",
)


#: Each column's place in a row of ``select(queue_messages)``: the receive reads its rows by
#: place (a ``RowMapping`` per row, and a lookup by name per field, cost more than the rest).
PLACE = {name: i for i, name in enumerate(M.c.keys())}
SEQ, DELIVERIES = PLACE["sequence_number"], PLACE["delivery_count"]
_FIELDS = tuple(
    PLACE[name]
    for name in (
        "queue",
        "message_id",
        "body",
        "enqueued_at",
        "session_id",
        "subject",
        "content_type",
        "correlation_id",
        "headers",
    )
)


def received_rows(
    rows: Sequence[Sequence[Any]], tokens: Sequence[str | None], locked_until: datetime | None
) -> list[ReceivedMessage]:
    """The messages of rows of ``select(queue_messages)``, read by place, each with its lock
    token (None: taken by ``receive_and_delete``, which counts no delivery on the message)."""
    queue, mid, body, enqueued, session, subject, ctype, corr, headers = _FIELDS
    out = []
    for row, token in zip(rows, tokens, strict=True):
        raw = row[headers]
        out.append(
            ReceivedMessage(
                row[queue],
                row[mid],
                bytes(row[body]),
                int(row[SEQ]),
                _utc(row[enqueued]),
                int(row[DELIVERIES]) + (token is not None),
                token,
                locked_until,
                row[session],
                row[subject],
                row[ctype],
                row[corr],
                {} if raw == "{}" else json.loads(raw),
            )
        )
    return out


def lock_tokens(n: int) -> list[str]:
    """``n`` fresh lock tokens, random UUIDs (version 4, as ``validation.lock_token`` reads
    them) from one ``os.urandom`` call rather than one ``uuid4`` (one system call) each."""
    raw = os.urandom(16 * n)
    return [str(uuid.UUID(bytes=raw[i : i + 16], version=4)) for i in range(0, 16 * n, 16)]


def dead_letter(row: RowMapping) -> DeadLetter:
    return DeadLetter(
        id=int(row["id"]),
        queue=row["queue"],
        message_id=row["message_id"],
        session_id=row["session_id"],
        body=bytes(row["body"]),
        subject=row["subject"],
        content_type=row["content_type"],
        correlation_id=row["correlation_id"],
        headers=json.loads(row["headers"]),
        enqueued_at=_utc(row["enqueued_at"]),
        sequence_number=int(row["sequence_number"]),
        delivery_count=int(row["delivery_count"]),
        reason=row["reason"],
        description=row["description"],
        dead_lettered_at=_utc(row["dead_lettered_at"]),
    )


def peeked(row: RowMapping | dict[str, Any], now: datetime) -> PeekedMessage:
    """A message row seen without locking it, in the state the receiver would find it in at
    ``now``: locked (a lock still holding), deferred, scheduled (not due yet) or active. The
    body is empty when the row was read without it (a list)."""
    locked_until = as_utc(row["locked_until"])
    not_before = _utc(row["not_before"])
    if locked_until is not None and locked_until > now:
        state = "locked"
    elif row["deferred"]:
        state = "deferred"
    elif not_before > now:
        state = "scheduled"
    else:
        state = "active"
    return PeekedMessage(
        queue=row["queue"],
        message_id=row["message_id"],
        sequence_number=int(row["sequence_number"]),
        session_id=row["session_id"],
        state=state,
        delivery_count=int(row["delivery_count"]),
        enqueued_at=as_utc(row["enqueued_at"]) or now,
        not_before=not_before,
        locked_until=locked_until,
        subject=row["subject"],
        content_type=row["content_type"],
        body=bytes(row["body"]) if "body" in row else b"",
        locked_at=as_utc(row["locked_at"]),
    )


def _utc(value: datetime) -> datetime:
    out = as_utc(value)
    assert out is not None
    return out


def move_to_dead_letters(
    conn: Connection,
    sequence_numbers: Sequence[int],
    *,
    reason: str,
    description: str,
    now: datetime,
) -> int:
    """Copy messages into dead letters and delete them, in the caller's transaction."""
    if not sequence_numbers:
        return 0
    source = sa_select(
        *(M.c[name] for name in COPIED_COLUMNS),
        M.c.sequence_number,
        M.c.delivery_count,
        literal(reason, String()).label("reason"),
        literal(description, Text()).label("description"),
        literal(now, DateTime(timezone=True)).label("dead_lettered_at"),
    ).where(M.c.sequence_number.in_(sequence_numbers))
    conn.execute(
        insert(D).from_select(
            [
                *COPIED_COLUMNS,
                "sequence_number",
                "delivery_count",
                "reason",
                "description",
                "dead_lettered_at",
            ],
            source,
        )
    )
    result = conn.execute(delete(M).where(M.c.sequence_number.in_(sequence_numbers)))
    return int(result.rowcount)


def lock_sessions(conn: Connection, keys: Iterable[tuple[str, str | None]]) -> None:
    """PostgreSQL: serialize senders of one session until commit.

    Sequence numbers come from a sequence, so two transactions sending to one session could commit
    out of order and a receiver could see message 6 before 5 exists (breaking FIFO and letting a
    second receiver take the session). Holding a per-session advisory lock while inserting makes
    sequence order equal commit order within a session. Keys are sorted to avoid deadlocks.
    """
    for queue, session in sorted({(q, s) for q, s in keys if s is not None}):
        conn.execute(
            sa_select(func.pg_advisory_xact_lock(func.hashtextextended(f"{queue}:{session}", 0)))
        )

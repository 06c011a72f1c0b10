"""The queue contract (``outbox.testing.contracts.queue``) on SQLite and on a real PostgreSQL,
plus the SQL backend's own checks (its writer mutex, its batched UPDATE).

Time only moves when a test advances the ManualClock; nothing sleeps.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dispatcher.queue.sql_queue import SqlQueue
from outbox.core.clock import ManualClock
from outbox.core.errors import LockLostError
from outbox.testing.contracts.queue import (
    DUPLICATE_DETECTION_WINDOW,
    LOCK_DURATION,
    MAX_BODY_BYTES,
    MAX_DELIVERY_COUNT,
    QueueContract,
    msg,
)


class TestSqlQueue(QueueContract):
    """Every contract test, once per ``sql_url`` (SQLite file, real PostgreSQL)."""

    @pytest.fixture(autouse=True)
    def _database(self, migrated_url: str) -> None:
        self.url = migrated_url

    def make_queue(self, clock: ManualClock) -> SqlQueue:
        return SqlQueue(
            self.url,
            clock=clock,
            lock_duration=LOCK_DURATION,
            max_delivery_count=MAX_DELIVERY_COUNT,
            duplicate_detection_window=DUPLICATE_DETECTION_WINDOW,
            max_body_bytes=MAX_BODY_BYTES,
        )

    def reopen_queue(self) -> SqlQueue:
        return SqlQueue(self.url)


# --- times are read once the write lock is held (review item 6) ------------------------------


class _SlowWriterLock:
    """Stands for the in-process SQLite writer mutex, taking ``seconds`` of clock time to get."""

    def __init__(self, inner: object, clock: ManualClock, seconds: float) -> None:
        self.inner, self.clock, self.seconds = inner, clock, seconds

    def __enter__(self) -> None:
        self.clock.advance(self.seconds)
        self.inner.__enter__()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)  # type: ignore[attr-defined]


def test_settling_after_a_long_wait_for_the_write_lock_sees_the_expired_lock(
    queue: SqlQueue, clock: ManualClock
) -> None:
    if queue.database.postgres:
        pytest.skip("the in-process writer mutex is SQLite's")
    queue.send("q", [msg("a"), msg("b")])
    a, b = queue.receive("q", 2)
    real = queue.database._writer
    queue.database._writer = _SlowWriterLock(real, clock, 31)  # type: ignore[assignment]
    with pytest.raises(LockLostError):
        queue.renew_lock(a)  # the 30 s lock expired while waiting: renewing it would be wrong
    with pytest.raises(LockLostError):
        queue.complete(b)
    [again] = queue.receive("q")  # locked from when the lock was actually taken
    queue.database._writer = real
    assert again.locked_until == clock.now() + timedelta(seconds=30)


def test_receive_locks_a_batch_with_one_update_statement(queue: SqlQueue) -> None:
    """Review item 12: one statement locks the batch (an executemany on SQLite, one UPDATE of an
    array of rows on PostgreSQL), not one UPDATE per row."""
    from sqlalchemy import event

    queue.send("q", [msg(f"m{i}") for i in range(5)])
    updates: list[bool] = []

    def seen(_c: object, _cur: object, stmt: str, _p: object, _ctx: object, many: bool) -> None:
        if stmt.lstrip().upper().startswith("UPDATE"):
            updates.append(many)

    event.listen(queue.engine, "before_cursor_execute", seen)
    try:
        assert len(queue.receive("q", 5)) == 5
    finally:
        event.remove(queue.engine, "before_cursor_execute", seen)
    assert len(updates) == 1

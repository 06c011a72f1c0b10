"""Duplicate-detection cleanup: time-based, bounded, and never failing a send that committed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from dispatcher.queue.messages import QueueMessage
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql.tables import duplicate_ids
from outbox.core.clock import ManualClock
from outbox.core.errors import QueueUnavailableError


def remembered(queue: SqlQueue) -> int:
    with queue.database.read("count") as conn:
        return int(conn.execute(select(func.count()).select_from(duplicate_ids)).scalar_one())


def test_cleanup_runs_by_time_even_in_a_short_lived_process(
    queue: SqlQueue, clock: ManualClock
) -> None:
    queue.send("q", QueueMessage(b"a", message_id="a"))
    clock.advance(601)  # "a" is out of the window; half a window has passed since the last clean
    queue.send("q", QueueMessage(b"b", message_id="b"))
    assert remembered(queue) == 1  # only "b": two sends were enough, not 256


def test_cleanup_is_bounded_per_run(queue: SqlQueue, clock: ManualClock) -> None:
    queue.send("q", [QueueMessage(b"x", message_id=f"m{i}") for i in range(5)])
    clock.advance(601)
    assert queue.forget_expired_duplicates(limit=2) == 2
    assert remembered(queue) == 3
    assert queue.forget_expired_duplicates(limit=None) == 3


def test_a_failing_cleanup_never_fails_a_committed_send(
    queue: SqlQueue, clock: ManualClock
) -> None:
    def down(*_a: Any, **_kw: Any) -> int:
        raise QueueUnavailableError("database is locked")

    queue.admin.forget_expired_duplicates = down  # type: ignore[method-assign]
    for i in range(257):  # past the old every-256-sends trigger, and due by time every time
        assert queue.send("q", QueueMessage(b"x", message_id=f"m{i}")) == [f"m{i}"]
        clock.advance(301)
    assert len(queue.peek("q", limit=500)) == 257

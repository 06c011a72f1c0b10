"""Queue fixtures: a migrated database per test (SQLite file and real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.core.clock import ManualClock


@pytest.fixture
def migrated_url(sql_url: str) -> str:
    upgrade(sql_url)
    return sql_url


@pytest.fixture
def queue(migrated_url: str, clock: ManualClock) -> Iterator[SqlQueue]:
    q = SqlQueue(
        migrated_url,
        clock=clock,
        lock_duration=30,
        max_delivery_count=3,
        duplicate_detection_window=600,
        max_body_bytes=1024,
    )
    yield q
    q.close()

"""The shipped inbox contract on the SQL inbox (SQLite and PostgreSQL), with the consumer's
queue in the inbox's own database (so the record and the completion share a transaction)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.queue.inbox import Inbox, SqlInbox, TransactionalInbox
from dispatcher.queue.sql_queue import SqlQueue
from outbox.core.clock import ManualClock
from outbox.testing.contracts.inbox import InboxConsumerContract


class TestSqlInbox(InboxConsumerContract):
    @pytest.fixture(autouse=True)
    def _queue(self, queue: SqlQueue, migrated_url: str) -> None:
        self.queue = queue
        self.url = migrated_url

    def make_inbox(self, consumer: str) -> Inbox:
        inbox = SqlInbox(self.queue.database, consumer)
        assert isinstance(inbox, TransactionalInbox)
        return inbox

    def make_queue(self, tmp_path: Path, clock: ManualClock) -> SqlQueue:
        queue = SqlQueue(
            self.url,
            clock=clock,
            lock_duration=30,
            max_delivery_count=5,
            duplicate_detection_window=600,
        )
        assert self.make_inbox("c").joins(queue.database)  # another object, the same database
        return queue

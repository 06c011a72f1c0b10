"""The shipped inbox contract on the SQL inbox (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from dispatcher.queue.inbox import Inbox, SqlInbox, TransactionalInbox
from dispatcher.queue.sql_queue import SqlQueue
from outbox.testing.contracts.inbox import InboxContract


class TestSqlInbox(InboxContract):
    @pytest.fixture(autouse=True)
    def _queue(self, queue: SqlQueue) -> None:
        self.queue = queue

    def make_inbox(self, consumer: str) -> Inbox:
        inbox = SqlInbox(self.queue.database, consumer)
        assert isinstance(inbox, TransactionalInbox)
        return inbox

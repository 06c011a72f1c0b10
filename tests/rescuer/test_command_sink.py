"""The kit's command-sink contract (``outbox.testing.contracts.command_sink``) on the in-memory
sink and on ``QueueSink`` over the SQL command queue (SQLite file, real PostgreSQL)."""

from __future__ import annotations

import pytest

from dispatcher.commands import COMMAND_SUBJECT, ProcessDocument
from dispatcher.queue.sql_queue import SqlQueue
from migrations.sql import upgrade
from outbox.core.clock import ManualClock
from outbox.testing.contracts.command_sink import CommandSinkContract, command
from rescuer.sink import CommandSink, InMemorySink, QueueSink

COMMANDS = "outbox-commands"


class TestInMemorySink(CommandSinkContract):
    supports_reopen = False  # a list in one process
    supports_unusable_storage = False  # nothing to be unreachable

    def make_sink(self) -> CommandSink:
        return InMemorySink()

    def held_commands(self, sink: CommandSink) -> list[ProcessDocument]:
        assert isinstance(sink, InMemorySink)
        return list(sink.commands)


class TestQueueSink(CommandSinkContract):
    """Once per ``sql_url``. The database is migrated by ``make_sink`` only, so
    ``make_unusable_sink`` gets the same fresh database without the queue's tables."""

    @pytest.fixture(autouse=True)
    def _database(self, sql_url: str) -> None:
        self.url = sql_url
        self.clock = ManualClock()  # the duplicate-detection window never runs out mid-test

    def make_sink(self) -> CommandSink:
        upgrade(self.url)
        return QueueSink(SqlQueue(self.url, clock=self.clock), COMMANDS)

    def reopen_sink(self, sink: CommandSink) -> CommandSink:
        return QueueSink(SqlQueue(self.url, clock=self.clock), COMMANDS)

    def make_unusable_sink(self) -> CommandSink:
        if self.url.startswith("sqlite:///"):  # an empty database file, never migrated
            import sqlite3

            sqlite3.connect(self.url.removeprefix("sqlite:///")).close()
        return QueueSink(SqlQueue(self.url, clock=self.clock, check_schema=False), COMMANDS)

    def held_commands(self, sink: CommandSink) -> list[ProcessDocument]:
        assert isinstance(sink, QueueSink)
        held = sink.queue.peek(COMMANDS, limit=100_000)
        return [ProcessDocument.from_json(p.body) for p in held]

    def test_a_command_is_a_session_message_named_by_its_id(self) -> None:
        """What the worker relies on: one session per document, duplicate detection by id."""
        sink = self.make_sink()
        assert isinstance(sink, QueueSink)
        try:
            c = command("doc-1", 4)
            sink.enqueue([c])
            [p] = sink.queue.peek(COMMANDS)
            assert p.message_id == c.command_id
            assert (p.session_id, p.subject) == ("doc-1", COMMAND_SUBJECT)
        finally:
            sink.close()

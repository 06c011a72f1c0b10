"""The command-sink contract: where a rescue pass puts its ``ProcessDocument`` commands.

What ``RescuePass`` relies on (``rescuer/runner.py``), and so what every ``CommandSink`` must do:

- ``enqueue`` returns only once the commands are durable, and returns how many were *new*: the
  pass reports ``duplicates_dropped = pending - enqueued``;
- it is idempotent by ``command_id``: a pass re-run after a crash before its checkpoint, or a
  second rescuer on the same table, enqueues the same ids again and must add nothing, whether the
  repeat comes in a later call, in the same call, or from another thread or process;
- a new ``up_to_seq`` or a new incarnation of a document is a new command;
- every field survives (table id, table URI, document id, up_to_seq, incarnation);
- a pass hands over all its pending documents in one call, so any size must work;
- when it cannot enqueue it raises an ``OutboxError`` (the CLI prints it as one line and the
  scheduler retries), never a driver's exception; the pass then leaves its checkpoint where it
  was, and the next pass enqueues the same commands again.

A sink subclasses ``CommandSinkContract`` and implements ``make_sink`` and ``held_commands``
(and ``reopen_sink`` / ``make_unusable_sink`` unless it clears the matching flag).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from dispatcher.commands import ProcessDocument
from outbox.core.errors import OutboxError
from rescuer.sink import CommandSink

TABLE_ID = "table-id-1"
TABLE_URI = "file:///contract/documents"


def command(doc_id: str, seq: int = 1, incarnation: str | None = "inc-1") -> ProcessDocument:
    """The command a pass would enqueue for document ``doc_id`` pending up to ``seq``."""
    return ProcessDocument(TABLE_ID, doc_id, seq, TABLE_URI, incarnation)


class CommandSinkContract:
    """Subclass as ``Test<YourSink>``; override ``make_sink`` and ``held_commands``."""

    #: ``reopen_sink``: another instance over the same storage sees (and deduplicates against)
    #: what the first one enqueued
    supports_reopen = True
    #: ``make_unusable_sink``: a sink whose storage cannot take commands (unreachable, no schema)
    supports_unusable_storage = True
    #: one instance may be used by several threads at once (rescuers racing in one process)
    thread_safe = True
    #: commands per call in the large-batch test (above any internal chunk size)
    large_batch = 1201

    def make_sink(self) -> CommandSink:
        """A fresh sink over empty storage (called after the subclass's autouse fixtures)."""
        raise NotImplementedError

    def held_commands(self, sink: CommandSink) -> list[ProcessDocument]:
        """Every command the storage holds, in enqueue order, as a worker would receive them."""
        raise NotImplementedError

    def reopen_sink(self, sink: CommandSink) -> CommandSink:
        """A second sink over ``sink``'s storage."""
        raise NotImplementedError

    def make_unusable_sink(self) -> CommandSink:
        """A sink whose storage cannot take commands."""
        raise NotImplementedError

    def close_sink(self, sink: CommandSink) -> None:
        """Release a sink; by default ``sink.close()`` when it has one."""
        close = getattr(sink, "close", None)
        if callable(close):
            close()

    def require(self, *features: str) -> None:
        """Skip the running test unless the sink claims every ``supports_<feature>``."""
        for feature in features:
            if not getattr(self, f"supports_{feature}"):
                pytest.skip(f"the sink does not claim {feature} (supports_{feature} = False)")

    @pytest.fixture
    def sink(self) -> Iterator[CommandSink]:
        s = self.make_sink()
        yield s
        self.close_sink(s)

    def test_enqueue_holds_every_command_with_every_field(self, sink: CommandSink) -> None:
        commands = [command("a", 3), command("b", 1, incarnation=None), command("c", 7)]
        assert sink.enqueue(commands) == 3
        assert self.held_commands(sink) == commands

    def test_an_empty_enqueue_is_a_no_op(self, sink: CommandSink) -> None:
        assert sink.enqueue([]) == 0
        assert self.held_commands(sink) == []

    def test_a_repeated_command_id_is_held_once_and_not_counted(self, sink: CommandSink) -> None:
        a, b, c = command("a"), command("b"), command("c")
        assert sink.enqueue([a, b]) == 2
        assert sink.enqueue([a, b]) == 0  # a pass re-run before its checkpoint
        assert sink.enqueue([b, c]) == 1
        assert self.held_commands(sink) == [a, b, c]

    def test_duplicates_inside_one_call_count_once(self, sink: CommandSink) -> None:
        a, b = command("a"), command("b")
        assert sink.enqueue([a, b, a, b]) == 2
        assert self.held_commands(sink) == [a, b]

    def test_a_new_seq_or_incarnation_is_a_new_command(self, sink: CommandSink) -> None:
        first, later = command("x", 1), command("x", 2)
        reborn = command("x", 1, incarnation="inc-2")  # deleted and created again
        assert sink.enqueue([first]) == 1
        assert sink.enqueue([later, reborn]) == 2
        assert self.held_commands(sink) == [first, later, reborn]

    def test_a_large_pass_is_enqueued_whole(self, sink: CommandSink) -> None:
        commands = [command(f"d{i:05d}") for i in range(self.large_batch)]
        assert sink.enqueue(commands) == self.large_batch
        assert sink.enqueue(commands) == 0
        assert self.held_commands(sink) == commands

    def test_racing_enqueues_hold_each_command_once(self, sink: CommandSink) -> None:
        if not self.thread_safe:
            pytest.skip("the sink does not claim thread safety (thread_safe = False)")
        commands = [command(f"d{i:03d}") for i in range(40)]
        counts: list[int] = []
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def rescuer(k: int) -> None:
            try:
                start.wait()
                mine = commands[k * 5 :] + commands[: k * 5]  # overlapping, different order
                counts.append(sink.enqueue(mine))
            except BaseException as e:  # reported below: a thread's exception is otherwise lost
                errors.append(e)

        threads = [threading.Thread(target=rescuer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(counts) == len(commands)  # every command counted new exactly once
        held = self.held_commands(sink)
        assert sorted(c.command_id for c in held) == sorted(c.command_id for c in commands)

    def test_commands_survive_a_new_sink_which_still_drops_repeats(self, sink: CommandSink) -> None:
        self.require("reopen")
        a, b = command("a"), command("b")
        assert sink.enqueue([a]) == 1
        other = self.reopen_sink(sink)
        try:
            assert self.held_commands(other) == [a]
            assert other.enqueue([a, b]) == 1
        finally:
            self.close_sink(other)
        assert self.held_commands(sink) == [a, b]

    def test_a_sink_that_cannot_enqueue_raises_an_outbox_error(self) -> None:
        self.require("unusable_storage")
        broken = self.make_unusable_sink()
        try:
            with pytest.raises(OutboxError) as err:
                broken.enqueue([command("a")])
            assert str(err.value)  # a message the CLI can print as one line
        finally:
            self.close_sink(broken)

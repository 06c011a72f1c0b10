"""The key-lines contract: a paused key's line keeps the order its messages first met the pause,
its gate passes hold by hold, a repeat removes nothing more, and two users of one store see one
line.

Why it ships: per-key order across documents and processes (docs/dispatcher.md, "Order per
ordering key") holds only if the store of paused keys does exactly this. A backend subclasses
``KeyLinesContract`` and implements ``make_lines`` (lines over a fresh, empty store; lines made in
one test share it); ``dispatcher.queue.key_lines.MemoryKeyLines`` and ``SqlKeyLines`` (SQLite,
PostgreSQL) run it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from dispatcher.queue.key_lines import Hold, Key, KeyLines, Wait

T0 = datetime(2026, 1, 1, tzinfo=UTC)
K: Key = ("q", "customer-7")
J: Key = ("q", "customer-9")


def wait(doc: str, seq: int, key: Key = K, life: str | None = "life") -> Wait:
    return Wait(key, doc, life, seq, f"{doc}-{seq}")


def runs(line: list[Hold]) -> list[tuple[str, int, int]]:
    return [(h.doc_id, h.seq, h.last_seq) for h in line]


class KeyLinesContract:
    """Subclass as ``Test<YourKeyLines>``; override ``make_lines``."""

    def make_lines(self) -> KeyLines:
        raise NotImplementedError

    @pytest.fixture
    def new_lines(self) -> Iterator[Callable[[], KeyLines]]:
        made: list[KeyLines] = []

        def make() -> KeyLines:
            made.append(self.make_lines())
            return made[-1]

        yield make
        for lines in made:
            close = getattr(lines, "close", None)
            if callable(close):
                close()

    @pytest.fixture
    def lines(self, new_lines: Callable[[], KeyLines]) -> KeyLines:
        return new_lines()

    def test_nothing_is_paused_at_first(self, lines: KeyLines) -> None:
        assert lines.paused_among({K, J}) == {}
        assert lines.lines() == {}

    def test_the_first_hold_pauses_the_key_and_is_its_gate(self, lines: KeyLines) -> None:
        got = lines.hold([wait("A", 1)], "broker down", T0)
        (gate,) = got[K]
        assert (gate.doc_id, gate.seq, gate.last_seq, gate.message_id) == ("A", 1, 1, "A-1")
        assert (gate.incarnation, gate.since, gate.reason) == ("life", T0, "broker down")
        assert lines.paused_among({K, J}) == {K: [gate]}

    def test_a_line_keeps_the_order_messages_met_the_pause(self, lines: KeyLines) -> None:
        """A's next message joins A's run while A is last; once B is behind it, A's later
        message waits behind B (it was committed after B's)."""
        lines.hold([wait("A", 1)], "down", T0)
        lines.hold([wait("A", 2)], "down", T0)  # nobody between: one run
        lines.hold([wait("B", 1)], "down", T0)
        lines.hold([wait("A", 3)], "down", T0)
        lines.hold([wait("A", 2), wait("B", 1)], "down", T0)  # already in line: no change
        assert runs(lines.paused_among({K})[K]) == [("A", 1, 2), ("B", 1, 1), ("A", 3, 3)]
        assert [h.reason for h in lines.lines()[K]] == ["down", "", ""]

    def test_holds_of_one_call_go_in_order_and_keys_apart(self, lines: KeyLines) -> None:
        got = lines.hold([wait("A", 1), wait("B", 1), wait("A", 2, J)], "down", T0)
        assert runs(got[K]) == [("A", 1, 1), ("B", 1, 1)]
        assert runs(got[J]) == [("A", 2, 2)]
        assert set(lines.lines()) == {K, J}

    def test_another_life_of_a_document_is_another_run(self, lines: KeyLines) -> None:
        lines.hold([wait("A", 1, life="old")], "down", T0)
        got = lines.hold([wait("A", 1, life="new")], "down", T0)
        assert [(h.doc_id, h.incarnation) for h in got[K]] == [("A", "old"), ("A", "new")]

    def test_the_gate_passes_hold_by_hold_and_a_repeat_removes_nothing(
        self, lines: KeyLines
    ) -> None:
        lines.hold([wait("A", 1), wait("B", 1), wait("C", 1)], "down", T0)
        gate = lines.lines()[K][0]
        assert runs(lines.remove(K, {gate.entry_id})) == [("B", 1, 1), ("C", 1, 1)]
        assert runs(lines.remove(K, {gate.entry_id})) == [("B", 1, 1), ("C", 1, 1)]
        rest = lines.lines()[K]
        assert lines.remove(K, {h.entry_id for h in rest}) == []
        assert lines.paused_among({K}) == {}
        assert lines.lines() == {}

    def test_a_delivered_run_that_grew_meanwhile_stays(self, lines: KeyLines) -> None:
        """A process delivered A-1 (its view: A's run is 1..1) while another extended the run
        to A-2: removing with the bound keeps the hold (A-2 is not delivered, B still waits),
        and removes it once the bound covers the run. Without the bound, A-2 was neither held
        nor sent and B's message overtook it (a review found it)."""
        lines.hold([wait("A", 1)], "down", T0)
        gate = lines.lines()[K][0]
        lines.hold([wait("A", 2)], "down", T0)  # another process: A's run grows to 2
        lines.hold([wait("B", 1)], "down", T0)
        assert runs(lines.remove(K, {gate.entry_id}, {gate.entry_id: 1})) == [
            ("A", 1, 2),
            ("B", 1, 1),
        ]
        assert runs(lines.remove(K, {gate.entry_id}, {gate.entry_id: 2})) == [("B", 1, 1)]

    def test_holds_racing_removals_lose_no_hold(self, new_lines: Callable[[], KeyLines]) -> None:
        """One user extends A's run on a key (A-2, A-3, ...) while another removes A's hold
        with each one's bound and holds it again: every message ends up delivered (removed
        within its bound) or still held, never lost to a removal that met an extension."""
        one, two = new_lines(), new_lines()
        one.hold([wait("A", 1)], "down", T0)
        start = threading.Barrier(2, timeout=60)
        errors: list[BaseException] = []
        delivered: list[Hold] = []

        def extend() -> None:
            try:
                start.wait()
                for seq in range(2, 40):
                    one.hold([wait("A", seq)], "down", T0)
            except BaseException as e:  # reported below
                errors.append(e)

        def deliver() -> None:
            try:
                start.wait()
                for _ in range(40):
                    line = two.paused_among({K}).get(K)
                    if line:
                        h = line[0]
                        two.remove(K, {h.entry_id}, {h.entry_id: h.last_seq})
                        delivered.append(h)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=extend), threading.Thread(target=deliver)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        left = one.lines().get(K, [])
        covered = {s for h in [*delivered, *left] for s in range(h.seq, h.last_seq + 1)}
        assert covered == set(range(1, 40)), (runs(left), runs(delivered))

    def test_open_empties_the_line_once(self, lines: KeyLines) -> None:
        lines.hold([wait("A", 1), wait("B", 1)], "down", T0)
        assert lines.open(K) is True
        assert lines.open(K) is False
        assert lines.paused_among({K}) == {}

    def test_the_longest_paused_key_is_listed_first(self, lines: KeyLines) -> None:
        lines.hold([wait("A", 1, J)], "down", T0)
        lines.hold([wait("B", 1, K)], "down", T0)
        assert list(lines.lines()) == [J, K]
        assert list(lines.lines(limit=1)) == [J]

    def test_two_users_of_one_store_see_one_line(self, new_lines: Callable[[], KeyLines]) -> None:
        """Two processes: what one holds, the other sees, and a gate one passes is passed for
        both."""
        one, two = new_lines(), new_lines()
        one.hold([wait("A", 1)], "down", T0)
        two.hold([wait("B", 1)], "down", T0)
        assert runs(one.paused_among({K})[K]) == [("A", 1, 1), ("B", 1, 1)]
        gate = two.paused_among({K})[K][0]
        one.remove(K, {gate.entry_id})
        assert runs(two.paused_among({K})[K]) == [("B", 1, 1)]

    def test_racing_holds_lose_nothing(self, new_lines: Callable[[], KeyLines]) -> None:
        """Four users hold ten documents each on one key at once: every document is in the line
        once."""
        users = [new_lines() for _ in range(4)]
        start = threading.Barrier(4, timeout=60)
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                start.wait()
                for n in range(10):
                    users[i].hold([wait(f"w{i}-d{n}", 1)], "down", T0)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        line = users[0].lines()[K]
        assert sorted(h.doc_id for h in line) == sorted(
            f"w{i}-d{n}" for i in range(4) for n in range(10)
        )
        for i in range(4):  # each user's own holds keep its order
            mine = [h.doc_id for h in line if h.doc_id.startswith(f"w{i}-")]
            assert mine == [f"w{i}-d{n}" for n in range(10)]

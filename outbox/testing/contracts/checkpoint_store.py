"""The checkpoint-store contract: compare-and-set on a generation, per (table, rescuer name).

Why it ships: a rescuer's safety after a crash rests on its checkpoint moving only forward and
only once per pass, even when two rescuers race (docs/design.md, "The flows"). A store for
another database subclasses ``CheckpointStoreContract`` and implements
``make_checkpoint_store``; ``close_checkpoint_store`` closes it after each test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from outbox.core.errors import CheckpointConflictError
from rescuer.checkpoint import CheckpointStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class CheckpointStoreContract:
    """Subclass as ``Test<YourStore>``; override ``make_checkpoint_store``."""

    #: one instance may be used by several threads at once (rescuers racing in one process)
    thread_safe = True

    def make_checkpoint_store(self) -> CheckpointStore:
        """A fresh, empty store (called after the subclass's autouse fixtures)."""
        raise NotImplementedError

    def close_checkpoint_store(self, store: CheckpointStore) -> None:
        """Release what ``make_checkpoint_store`` opened; by default ``store.close()`` if any."""
        close = getattr(store, "close", None)
        if callable(close):
            close()

    @pytest.fixture
    def store(self) -> Iterator[CheckpointStore]:
        s = self.make_checkpoint_store()
        yield s
        self.close_checkpoint_store(s)

    def test_compare_and_set(self, store: CheckpointStore) -> None:
        assert store.read("t", "r") is None
        first = store.write("t", "r", expected_generation=None, version=3, at=NOW, details={"a": 1})
        assert (first.version, first.generation) == (3, 1)
        with pytest.raises(CheckpointConflictError, match="moved by another rescuer"):
            store.write("t", "r", expected_generation=None, version=4, at=NOW, details={})
        second = store.write("t", "r", expected_generation=1, version=5, at=NOW, details={})
        assert second.generation == 2
        with pytest.raises(CheckpointConflictError):
            store.write("t", "r", expected_generation=1, version=9, at=NOW, details={})
        got = store.read("t", "r")
        assert got is not None
        assert (got.version, got.generation) == (5, 2)
        assert [c.rescuer_name for c in store.list("t")] == ["r"]
        assert store.read("t", "other") is None

    def test_forget_deletes_one_checkpoint_and_a_new_one_can_start(
        self, store: CheckpointStore
    ) -> None:
        store.write("t", "r", expected_generation=None, version=3, at=NOW, details={})
        store.write("t", "keep", expected_generation=None, version=1, at=NOW, details={})
        assert store.forget("t", "r") is True
        assert store.forget("t", "r") is False
        assert store.read("t", "r") is None
        assert [c.rescuer_name for c in store.list("t")] == ["keep"]
        fresh = store.write("t", "r", expected_generation=None, version=7, at=NOW, details={})
        assert (fresh.version, fresh.generation) == (7, 1)

    def test_racing_writers_neither_lose_nor_double_advance(self, store: CheckpointStore) -> None:
        """8 threads each add 1 to the version 10 times through read + CAS: exactly 80 advances."""
        if not self.thread_safe:
            pytest.skip("the store does not claim thread safety (thread_safe = False)")
        store.write("t", "r", expected_generation=None, version=0, at=NOW, details={})

        failed: list[BaseException] = []

        def worker() -> None:
            try:
                advance()
            except BaseException as e:  # the test reports it below, not as a thread warning
                failed.append(e)

        def advance() -> None:
            done = 0
            while done < 10:
                cp = store.read("t", "r")
                assert cp is not None
                assert cp.version is not None
                try:
                    store.write(
                        "t",
                        "r",
                        expected_generation=cp.generation,
                        version=cp.version + 1,
                        at=NOW,
                        details={},
                    )
                    done += 1
                except CheckpointConflictError:
                    continue

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, f"a racing writer failed: {failed[0]!r}"
        final = store.read("t", "r")
        assert final is not None
        assert final.version == 80
        assert final.generation == 81

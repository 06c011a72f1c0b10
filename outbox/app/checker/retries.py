"""What a checker writer does instead of enqueueing its retry commands, and of pausing its keys,
in a stranded round (``outbox.app.checker.procs``'s writers use it).

Why a module of its own: it is the one place that decides what "stranded" means for a writer
(only the rescuer may deliver the round), which the rescuer's broken builds rely on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from unittest import mock

if TYPE_CHECKING:
    from dispatcher.commands import DocRef


class Journal(Protocol):
    def write(self, event: dict[str, Any]) -> None: ...


class RetryCommands:
    """Stands in for the writer's ``runtime.enqueue_commands``: journals every retry command
    *before* it is enqueued (so a kill in between can only over-count them), and drops them
    while ``suppress`` is on (a stranded round: as if the process died before enqueueing).

    ``stranded`` also drops the paused-key holds (gates), which every worker batch sends: with
    them, "only the rescuer delivers it" was false (the sink-swallows-one build escaped). The
    round's documents are fresh, so no order rests on them; ``_compete`` keeps its holds."""

    def __init__(self, runtime: Any, journal: Journal) -> None:
        self._real = runtime.enqueue_commands
        self._journal = journal
        self.suppress = False
        self.stranded = False
        mock.patch.object(runtime, "enqueue_commands", self).start()
        keys = runtime.dispatcher.keys
        real_hold = keys.hold

        def hold(waits: Sequence[Any], reason: str) -> None:
            if not self.stranded:
                real_hold(waits, reason)
                return
            docs = sorted({w.doc_id for w in waits})
            self._journal.write({"event": "holds_suppressed", "docs": docs, "at": time.time()})

        mock.patch.object(keys, "hold", hold).start()

    def __call__(self, docs: Iterable[DocRef], *, delay: float = 0.0) -> int:
        pairs = list(docs)
        event = "retry_suppressed" if self.suppress else "retry"
        self._journal.write({"event": event, "docs": [d[0] for d in pairs], "at": time.time()})
        return 0 if self.suppress else int(self._real(pairs, delay=delay))

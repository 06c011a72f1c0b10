"""Deliberately broken builds for the end-to-end checker: it must catch every one of them.

A checker that only ever says "ok" proves nothing. Each mutation here breaks one promise the way a
plausible bug would, and ``tests/e2e/test_checker_mutations.py`` requires the checker to fail the
seed and to name the invariant that caught it.

How a mutation reaches the code it breaks: the checker's supervisor runs the rescuer in its own
process, so rescuer mutations wrap the supervisor's objects (``wrap_sink``, ``wrap_rescuer``).
Writers and workers are child processes, so their mutations are applied *inside* the child, by the
checker's child entry points (``outbox.checker.procs``), on that child's own ``Outbox``
(``patch_outbox``) and transport (``wrap_transport``). The mutation's name travels in the child's
configuration; ``OUTBOX_CHECK_MUTATION`` only seeds it for ``outbox check``. Production code never
reads either: nothing here is imported outside the testing kit and the checker.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

from dispatcher.dispatch import to_transport_message
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.errors import ConfigurationError

ENV_VAR = "OUTBOX_CHECK_MUTATION"


class MutationError(RuntimeError):
    """What a mutated rescuer raises: deliberately *not* an ``OutboxError``."""


@dataclass(frozen=True)
class Mutation:
    """One broken build. Every hook defaults to "leave it alone"."""

    name: str
    breaks: str  # the invariant (or report field) that must catch it
    description: str

    def wrap_sink(self, sink: Any) -> Any:
        return sink

    def wrap_rescuer(self, rescuer: Any) -> Any:
        return rescuer

    def wrap_transport(self, transport: Transport) -> Transport:
        return transport

    def patch_outbox(self, ob: Any) -> None:
        """Break something in a child's freshly opened ``Outbox`` (writer or worker)."""

    def at_writer_start(self) -> None:
        """Runs first thing in every writer process."""

    def supervisor_writes(self) -> contextlib.AbstractContextManager[Any]:
        """Around the supervisor's own unit of work (the delete-and-re-create step)."""
        return contextlib.nullcontext()


# --- the rescuer (in the supervisor) ---------------------------------------------------------


class _EnqueueNothing:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.enqueued = 0

    def enqueue(self, commands: Sequence[Any]) -> int:
        return 0


class RescuerEnqueuesNothing(Mutation):
    def wrap_sink(self, sink: Any) -> Any:
        return _EnqueueNothing(sink)


class _RaisingPass:
    def run(self) -> Any:
        raise MutationError("mutated rescuer: every pass raises")


class RescuerRaises(Mutation):
    def wrap_rescuer(self, rescuer: Any) -> Any:
        return _RaisingPass()


# --- writers and workers (in the child) ------------------------------------------------------


class _Reordering:
    """Swaps the first two messages of one session inside a batch: a broker that reorders."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    @property
    def atomic_batches(self) -> bool:
        return bool(getattr(self.inner, "atomic_batches", False))

    def send(self, batch: Sequence[TransportMessage]) -> None:
        out = list(batch)
        seen: dict[str | None, int] = {}
        for i, m in enumerate(out):
            j = seen.setdefault(m.session_id, i)
            if j != i:
                out[i], out[j] = out[j], out[i]
                break
        self.inner.send(out)

    def close(self) -> None:
        self.inner.close()


class TransportReorders(Mutation):
    def wrap_transport(self, transport: Transport) -> Transport:
        return _Reordering(transport)


class SendsBeforeCommit(Mutation):
    """The dispatcher publishes a unit of work's messages before its MERGE: a save that then
    fails (another writer got there first) leaves messages in the broker that nobody committed."""

    def patch_outbox(self, ob: Any) -> None:
        store, transport = ob.store, ob.runtime.transport
        real_save: Callable[[Sequence[Any]], int] = store.save

        def save(writes: Sequence[Any]) -> int:
            batch = [to_transport_message(m, w.row.id) for w in writes for m in w.row.pending()]
            if batch:
                with contextlib.suppress(Exception):  # the broken build does not care either
                    transport.send(batch)
            return real_save(writes)

        mock.patch.object(store, "save", save).start()


class WatermarkLowers(Mutation):
    """A watermark MERGE that, after advancing, writes each document's ``dispatched_seq`` one
    lower (once per document and process, so the run still ends): a botched ``greatest``."""

    def patch_outbox(self, ob: Any) -> None:
        store = ob.store
        real: Callable[..., int | None] = store.advance_watermarks
        lowered: set[str] = set()

        def advance(marks: Mapping[str, int], *args: Any, **kwargs: Any) -> int | None:
            version = real(marks, *args, **kwargs)
            lower = {d: s - 1 for d, s in marks.items() if s >= 1 and d not in lowered}
            if lower:
                lowered.update(lower)
                with contextlib.suppress(Exception):  # a commit conflict: it just gives up
                    _force_watermarks(store, lower)
            return version

        mock.patch.object(store, "advance_watermarks", advance).start()
        # every mark goes through the MERGE above (none rides along in a save's MERGE)
        store.mark_source = None


def _force_watermarks(store: Any, marks: Mapping[str, int]) -> None:
    import pyarrow as pa

    store.refresh()
    ids = list(marks)
    source = pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "bucket": pa.array([store.bucket(i) for i in ids], pa.int32()),
            "dispatched_seq": pa.array([marks[i] for i in ids], pa.int64()),
        }
    )
    (
        store.delta_table.merge(
            source,
            predicate="t.bucket = s.bucket AND t.id = s.id",
            source_alias="s",
            target_alias="t",
        )
        .when_matched_update(updates={"dispatched_seq": "s.dispatched_seq"})
        .execute()
    )


class IdsIgnoreIncarnation(Mutation):
    """Message ids derived from (table, id, seq) alone, as before incarnations: a document deleted
    outside the library and created again reuses its old ids, and duplicate detection drops the
    new messages. Every writer (children and the supervisor's re-create) computes them so."""

    def patch_outbox(self, ob: Any) -> None:
        self.supervisor_writes().start()

    def supervisor_writes(self) -> Any:
        from outbox.core.model import message_id_for

        def without_incarnation(
            table_id: str, doc_id: str, seq: int, incarnation: str | None = None
        ) -> str:
            return message_id_for(table_id, doc_id, seq, None)

        return mock.patch("outbox.unit_of_work.message_id_for", without_incarnation)


class WritersDieAtStart(Mutation):
    def at_writer_start(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


MUTATIONS: dict[str, Mutation] = {
    m.name: m
    for m in (
        RescuerEnqueuesNothing(
            "rescuer-enqueues-nothing", "I1 no loss", "the rescue sink drops every command"
        ),
        RescuerRaises("rescuer-raises", "rescue_errors", "every rescue pass raises"),
        TransportReorders(
            "transport-reorders", "I2 order", "the broker swaps two messages of one document"
        ),
        SendsBeforeCommit(
            "sends-before-commit", "I3 no phantom", "the dispatcher sends before the commit"
        ),
        WatermarkLowers(
            "watermark-lowers", "I4 no interference", "the watermark MERGE lowers dispatched_seq"
        ),
        WritersDieAtStart("writers-die-at-start", "committed", "every writer dies at start-up"),
        IdsIgnoreIncarnation(
            "ids-ignore-incarnation",
            "I6 idempotence",
            "a re-created document's messages reuse the deleted one's ids",
        ),
    )
}


def get(name: str | None) -> Mutation | None:
    """The mutation called ``name`` (None or "" for the intact build)."""
    if not name:
        return None
    try:
        return MUTATIONS[name]
    except KeyError:
        raise ConfigurationError(
            f"{ENV_VAR}={name!r} names no mutation", hint=f"known: {', '.join(MUTATIONS)}"
        ) from None

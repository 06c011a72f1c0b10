"""Deliberately broken builds for the end-to-end checker: it must catch every one of them.

A checker that only ever says "ok" proves nothing. Each mutation here breaks one promise the way a
plausible bug would, and ``tests/e2e/test_checker_mutations.py`` requires the checker to fail the
seed and to name the invariant that caught it.

How a mutation reaches the code it breaks: the checker's supervisor runs the rescuer in its own
process, so rescuer mutations wrap the supervisor's objects (``wrap_sink``, ``wrap_rescuer``) or
break the production rescuer's own code there for the seed's duration (``supervisor_rescue``:
``RescuePass``, ``QueueSink``, the planner), which is caught only because the checker runs the
production rescuer, not a stand-in.
Writers and workers are child processes, so their mutations are applied *inside* the child, by the
checker's child entry points (``outbox.app.checker.procs``), on that child's own ``Outbox``
(``patch_outbox``) and transport (``wrap_transport``). The mutation's name travels in the child's
configuration; ``OUTBOX_CHECK_MUTATION`` only seeds it for ``outbox check``. Production code never
reads either: nothing here is imported outside the checker.

Why in the checker, not the proving ground (``testkit``, which the wheel leaves out): the broken
builds are part of what ``outbox check`` does (``OUTBOX_CHECK_MUTATION=name outbox check``), so an
installed checker can show it fails on each of them.

Why one module: it is the catalogue of broken builds, each a few lines, and ``MUTATIONS`` is the
one list ``tests/e2e/test_checker_mutations.py`` holds against its tests; split by where each
applies (supervisor, child, transport), the list would be assembled from three places.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

from dispatcher.dispatch import to_transport_message
from dispatcher.transports.base import Capabilities, Transport, TransportMessage
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

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        """Around the whole seed in the supervisor: breaks the production rescuer's classes or
        functions themselves (undone when the seed ends)."""
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


class CheckpointPastTheWindow(Mutation):
    """``RescuePass`` advances its checkpoint to the newest version instead of the window's end
    (the newest version at least ``rescue_delay`` old): the young tail, which the pass did not
    enqueue, is behind the checkpoint, so a document stranded there is never rescued."""

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        from rescuer.runner import RescuePass

        real: Callable[..., int | None] = RescuePass._advance

        def advance(rescuer: Any, cp: Any, end: Any, *args: Any, **kwargs: Any) -> int | None:
            return real(rescuer, cp, dataclasses.replace(end, end=end.latest), *args, **kwargs)

        return mock.patch.object(RescuePass, "_advance", advance)


class SinkSwallowsOne(Mutation):
    """``QueueSink.enqueue`` sends all but the last command of each call and counts that one as
    enqueued (an off-by-one in its batching): the pass believes it is durable and moves on."""

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        from rescuer.sink import QueueSink

        real: Callable[[Any, Sequence[Any]], int] = QueueSink.enqueue

        def enqueue(sink: Any, commands: Sequence[Any]) -> int:
            if not commands:
                return real(sink, commands)
            return real(sink, commands[:-1]) + 1

        return mock.patch.object(QueueSink, "enqueue", enqueue)


class PlannerOffByOne(Mutation):
    """The planner's pending rows (``rescuer.planner.pending_from_rows``, which every plan goes
    through: a feed plan on either engine and a sweep) take ``last_seq > dispatched_seq + 1`` for
    pending: a document with one message left to send is left out, so it is never rescued."""

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        import rescuer.cdf_local  # noqa: F401 - the local engine holds the function by name too
        from rescuer import planner

        real = planner.pending_from_rows

        def pending_from_rows(rows: Iterable[Sequence[Any]]) -> tuple[Any, ...]:
            return real(r for r in rows if int(r[1]) > int(r[2]) + 1)

        return _replaced(
            real, pending_from_rows, ("rescuer.planner", "rescuer.cdf_local", "rescuer.cdf_spark")
        )


@contextlib.contextmanager
def _replaced(real: Any, broken: Any, modules: Sequence[str]) -> Iterator[None]:
    """``broken`` for ``real`` wherever one of the (imported) ``modules`` holds it by name."""
    held = [
        (module, attr)
        for module in filter(None, (sys.modules.get(name) for name in modules))
        for attr, value in vars(module).items()
        if value is real
    ]
    if not held:
        raise RuntimeError(f"no module of {list(modules)} holds {real!r}: nothing to break")
    with contextlib.ExitStack() as stack:
        for module, attr in held:
            stack.enter_context(mock.patch.object(module, attr, broken))
        yield


# --- writers and workers (in the child) ------------------------------------------------------


class _Reordering:
    """Swaps the first two messages of one session inside a batch: a broker that reorders."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    @property
    def atomic_batches(self) -> bool:
        return Capabilities.of(self.inner).atomic_batches

    @property
    def coalesce_sends(self) -> bool:
        return Capabilities.of(self.inner).coalesce_sends

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


FORCE_ATTEMPTS = 20  # a lowering MERGE that loses a commit race tries again this often


class WatermarkLowers(Mutation):
    """A watermark that, once written, is followed by a MERGE writing every row of each document
    with ``dispatched_seq`` one lower (once per document and process, so the run still ends): a
    writer that assigns a watermark instead of raising it. A MERGE that loses a commit race is
    retried (``FORCE_ATTEMPTS``): given up at once, a seed whose every lowering met a concurrent
    commit would show no regression, and whether one does depends on timing."""

    def patch_outbox(self, ob: Any) -> None:
        store = ob.store
        real: Callable[..., int | None] = store.advance_watermarks
        lowered: set[str] = set()

        def advance(marks: Mapping[str, int], *args: Any, **kwargs: Any) -> int | None:
            version = real(marks, *args, **kwargs)
            lower = {d: s - 1 for d, s in marks.items() if s >= 1 and d not in lowered}
            if lower:
                lowered.update(lower)
                for _ in range(FORCE_ATTEMPTS):
                    try:
                        _force_watermarks(store, lower)
                        break
                    except Exception:  # a commit conflict: again, on a fresh snapshot
                        continue
            return version

        mock.patch.object(store, "advance_watermarks", advance).start()
        # every mark goes through the call above (none rides along in a save's append)
        store.detach_watermarks()


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


class ReadersShowTombstones(Mutation):
    """The one definition of current documents (``outbox.delta.current``) keeps tombstones
    whatever the reader asked: ``read_documents`` returns deleted documents. Broken in the
    supervisor, where the verdict reads the documents; the supervisor's delete step leaves a
    tombstone in the table (no fold runs after the writers), so it is there to be shown."""

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        from outbox.delta import current

        real_sql, real_rows = current.current_sql, current.current_rows

        def current_sql(source: str, **options: Any) -> str:
            return real_sql(source, **{**options, "include_deleted": True})

        def current_rows(table: Any, *, include_deleted: bool = True) -> Any:
            return real_rows(table, include_deleted=True)

        stack = contextlib.ExitStack()
        stack.enter_context(mock.patch.object(current, "current_sql", current_sql))
        stack.enter_context(mock.patch.object(current, "current_rows", current_rows))
        return stack


class FoldRemovesUnsentTombstones(Mutation):
    """The fold (``outbox.delta.fold``) removes every row of a deleted document whether or not
    its tombstone's last messages were sent: they are never delivered. Broken in every process
    that folds (the writers' upkeep, and the supervisor's fold right after its delete, whose
    tombstone's last message is surely unsent then)."""

    def patch_outbox(self, ob: Any) -> None:
        self.supervisor_rescue().__enter__()

    def supervisor_rescue(self) -> contextlib.AbstractContextManager[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from outbox.delta import fold

        def every_tombstone(joined: Any) -> Any:
            if "deleted" not in joined.column_names:
                return pa.array([], pa.string())
            newest = pc.equal(joined["version"], joined["version_max"])
            top = joined.filter(pc.and_(newest, pc.fill_null(joined["deleted"], False)))
            return pc.unique(pc.cast(top["id"], pa.string()))

        return mock.patch.object(fold, "_sent_tombstones", every_tombstone)


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
        CheckpointPastTheWindow(
            "rescue-checkpoint-past-window",
            "I1 no loss",
            "the rescue pass advances its checkpoint over the young tail it did not enqueue",
        ),
        SinkSwallowsOne(
            "rescue-sink-swallows-one",
            "I1 no loss",
            "the production sink drops the last command of each enqueue, counting it as sent",
        ),
        PlannerOffByOne(
            "rescue-planner-off-by-one",
            "I1 no loss",
            "the rescue planner counts a document with one pending message as dispatched",
        ),
        TransportReorders(
            "transport-reorders", "I2 order", "the broker swaps two messages of one document"
        ),
        SendsBeforeCommit(
            "sends-before-commit", "I3 no phantom", "the dispatcher sends before the commit"
        ),
        WatermarkLowers(
            "watermark-lowers", "I4 no interference", "a watermark then lowers dispatched_seq"
        ),
        WritersDieAtStart("writers-die-at-start", "committed", "every writer dies at start-up"),
        IdsIgnoreIncarnation(
            "ids-ignore-incarnation",
            "I6 idempotence",
            "a re-created document's messages reuse the deleted one's ids",
        ),
        ReadersShowTombstones(
            "readers-show-tombstones",
            "documents",
            "the current documents include deleted ones (tombstones)",
        ),
        FoldRemovesUnsentTombstones(
            "fold-removes-unsent-tombstones",
            "I1 no loss",
            "the fold removes a deleted document's rows before its last messages are sent",
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

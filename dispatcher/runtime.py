"""The dispatcher runtime: what ``Outbox.open`` wires behind every commit.

It owns the transport, the command queue (lazily: an application that publishes to memory and never
defers needs no SQL at all), the ``Dispatcher`` and the metrics, and chooses between

* **immediate** dispatch: right after the commit, send what the saved rows hold (they are already
  in memory; nothing is re-read); the watermarks go to a ``WatermarkWriter``, which writes them
  in one commit per ``watermark_window`` off the caller's path (``dispatcher/watermarks.py`` has
  the trade-off: a crash before that commit means re-sends with the same ids, never a loss); and
* **deferred** dispatch: only enqueue a ``ProcessDocument`` command per saved document with
  pending messages; the ``outbox run-dispatcher`` worker publishes.

When an immediate dispatch leaves a document pending (a send failed, or the watermark was not
written), the runtime enqueues a ``ProcessDocument`` command for it, scheduled ``retry_delay``
seconds out. Why not just leave it to the rescuer: the rescuer only looks after its delay (15 s to
1 h) and a pass interval, while a command is picked up by the worker within a second or two of its
schedule, with backoff and dead-lettering from the queue. The command id is derived from
(table, id, last_seq), so the rescuer enqueueing the same command later is dropped as a duplicate.
If even that enqueue fails (the database is down), it is logged and counted, and the rescuer
remains the safety net. Nothing here ever raises to the application (I4).

The transport, the SQL queue and the command queue come from a ``RuntimeBackends`` (in production
``outbox.wiring.Backends``, which turns the settings into them and closes them): the runtime never
chooses a backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from dispatcher import hooks
from dispatcher.combining import DispatchCombiner
from dispatcher.commands import DocRef, commands_for
from dispatcher.dispatch import DEFAULT_MAX_BATCH_MESSAGES, Dispatcher, DispatchReport
from dispatcher.hooks import StepHook
from dispatcher.metrics import DispatchMetrics, MetricsObserver
from dispatcher.transports.base import Transport, adopt_settings
from dispatcher.watermarks import WatermarkWriter
from outbox.core.clock import Clock, SystemClock
from outbox.core.model import DocumentRow
from outbox.core.observers import Observer, Observers
from outbox.core.tracing import TRACING

if TYPE_CHECKING:
    from dispatcher.queue.command_queue import CommandQueue
    from dispatcher.queue.key_lines import KeyLines
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.settings import Settings
    from outbox.delta.store import DeltaDocumentStore

log = logging.getLogger("outbox.dispatcher")


#: Seconds before the worker picks up the command for a failed immediate dispatch.
DEFAULT_RETRY_DELAY = 2.0


class RuntimeBackends(Protocol):
    """What the runtime takes from whoever chose the backends (``outbox.wiring.Backends``):
    each built on first use and closed by its owner, not by the runtime."""

    @property
    def sql_queue(self) -> SqlQueue: ...

    def transport(self) -> Transport: ...

    def command_queue(self) -> CommandQueue: ...

    def key_lines(self) -> KeyLines: ...


@dataclass(frozen=True)
class RuntimeOptions:
    """What a ``DispatcherRuntime`` takes besides its store, settings and backends: the clock,
    the metrics, crash points and extra observers (defaults: the system clock, fresh metrics,
    the installed crash points, none), the retry command's delay, the most messages per send
    batch, and the watermark window (default: ``settings.watermark_window``)."""

    clock: Clock | None = None
    metrics: DispatchMetrics | None = None
    crash_points: StepHook | None = None
    observers: Sequence[Observer] = ()
    retry_delay: float = DEFAULT_RETRY_DELAY
    max_batch_messages: int | None = None
    watermark_window: float | None = None


class RuntimeKeywords(TypedDict, total=False):
    """``RuntimeOptions``' fields as ``DispatcherRuntime``'s keyword arguments."""

    clock: Clock | None
    metrics: DispatchMetrics | None
    crash_points: StepHook | None
    observers: Sequence[Observer]
    retry_delay: float
    max_batch_messages: int | None
    watermark_window: float | None


class DispatcherRuntime:
    """Transport + command queue + dispatcher, and the after-commit hook that drives them."""

    def __init__(
        self,
        store: DeltaDocumentStore,
        settings: Settings,
        backends: RuntimeBackends,
        *,
        options: RuntimeOptions | None = None,
        **keywords: Unpack[RuntimeKeywords],
    ) -> None:
        """``options`` (``RuntimeOptions``), and any of its fields as a keyword over it."""
        opts = self.options = replace(options or RuntimeOptions(), **keywords)
        self.store = store
        self.settings = settings
        self.backends = backends
        self.clock = opts.clock or SystemClock()
        self.metrics = opts.metrics or DispatchMetrics()
        self.crash_points = opts.crash_points or hooks.installed()
        #: What watches every step: the counters, the spans, a proof's crash points (in that
        #: order: a crash point fires after the step was counted), and ``observers``.
        self.observe: Observer = Observers(
            [
                MetricsObserver(self.metrics),
                TRACING,
                hooks.observer(self.crash_points),
                *opts.observers,
            ]
        )
        self.retry_delay = opts.retry_delay
        self.mode = settings.dispatch
        self.transport: Transport = backends.transport()
        adopt_settings(self.transport, settings)  # e.g. geo's claim_log_timeout
        # The watermarks of immediate dispatch, coalesced off the caller's path (None: one commit
        # inline per dispatch). Reads in this process flush first, so they see every mark earned.
        self.watermarks: WatermarkWriter | None = None
        window = (
            settings.watermark_window if opts.watermark_window is None else opts.watermark_window
        )
        if window > 0:
            self.watermarks = WatermarkWriter(store, window=window, observer=self.observe)
            store.attach_watermarks(self.watermarks)
        self.dispatcher = Dispatcher(
            store,
            self.transport,
            max_in_flight=settings.max_in_flight,
            observer=self.observe,
            max_batch_messages=opts.max_batch_messages or DEFAULT_MAX_BATCH_MESSAGES,
            watermarks=self.watermarks,
            key_lines=backends.key_lines(),
        )
        self.last_report: DispatchReport | None = None
        self.combiner = DispatchCombiner(self._dispatch_committed)
        self._closed = False

    @property
    def queue(self) -> SqlQueue:
        """The SQL queue on ``settings.sql_url`` (commands, and the SQL transport's messages)."""
        return self.backends.sql_queue

    @property
    def commands(self) -> CommandQueue:
        """The queue that carries ``ProcessDocument`` commands (``command_transport``)."""
        return self.backends.command_queue()

    def pool_size(self, worker_threads: int = 0) -> int:
        """Connections the queue needs: one per concurrent send, two per worker thread (its
        receive/settle and its lock renewer), and a few for everything else. A
        ``DispatcherWorker`` built on this runtime grows the pool to this size for its threads."""
        return self.settings.max_in_flight + 2 * worker_threads + 2

    # --- the commit hook --------------------------------------------------------------------

    def after_commit(self, rows: Sequence[DocumentRow], version: int) -> None:
        """Called by the unit of work right after its commit, with the rows it saved. Immediate
        dispatch goes through the combiner: commits of other threads that finished meanwhile
        share the call (``dispatcher/combining.py``); this returns once its rows' call did."""
        started = time.perf_counter()
        self.observe.committed()
        try:
            if self.mode == "deferred":
                self.enqueue_commands(
                    (r.id, r.last_seq, r.incarnation) for r in rows if r.has_pending
                )
                return
            self.combiner.dispatch(rows, started)
            self.observe.dispatched(time.perf_counter() - started)
        except Exception:  # never reaches the application: the commit happened (I4)
            log.exception(
                "dispatch after commit %d failed; a command or the rescuer finishes", version
            )

    def _dispatch_committed(self, rows: Sequence[DocumentRow], started: float) -> None:
        """One dispatch of one or more commits' rows; a document it leaves pending gets a retry
        command. Raises no ``Exception`` (each commit's caller would otherwise see it)."""
        try:
            report = self.dispatcher.dispatch(
                rows, started=started, defer_watermark=self.watermarks is not None
            )
            self.last_report = report
            if report.failed:
                by_id = {r.id: r for r in rows}
                self.enqueue_commands(
                    ((d, by_id[d].last_seq, by_id[d].incarnation) for d in report.failed),
                    delay=self.retry_delay,
                )
        except Exception:
            log.exception(
                "dispatch of %d committed document(s) failed; a command or the rescuer finishes",
                len(rows),
            )

    def enqueue_commands(self, docs: Iterable[DocRef], *, delay: float = 0.0) -> int:
        """Enqueue ``ProcessDocument`` for (id, last_seq[, incarnation]); returns how many were
        sent.

        A failure is logged and counted, not raised: the rescuer will find these documents.
        """
        commands = commands_for(self.store.table_id, self.settings.table_uri, docs)
        if not commands:
            return 0
        not_before = self.clock.now() + timedelta(seconds=delay) if delay > 0 else None
        messages = [c.to_queue_message(not_before=not_before) for c in commands]
        try:
            self.commands.send(self.settings.command_queue, messages)
        except Exception as e:
            self.observe.commands_enqueued(len(commands), failed=True)
            log.warning(
                "could not enqueue ProcessDocument for %d document(s) (%s); the rescuer will "
                "find them after its delay",
                len(commands),
                e,
            )
            return 0
        self.observe.commands_enqueued(len(commands))
        return len(commands)

    def close(self) -> None:
        """Stop the watermark writer (its marks written, or re-sent later) and the dispatcher's
        pool; the backends are closed by their owner."""
        if self._closed:
            return
        self._closed = True
        if self.watermarks is not None:  # before the store closes: written, or re-sent later
            self.watermarks.close()
            self.store.detach_watermarks(self.watermarks)
        self.dispatcher.close()

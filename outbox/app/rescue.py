"""One rescuer, built the same way for ``outbox rescue``, the Spark job and the checker.

Why one builder: the CLI and the Spark job used to put the pass together each on its own, with
different error texts, and the checker a third time; a broken production rescuer must fail the
checker, so all three build it here, from the backends the settings choose
(``outbox.wiring.Backends``), and only wrap what they must (the checker records what the sink's
queue accepted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outbox.core.clock import Clock, SystemClock
from outbox.core.durations import format_duration
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.settings import Settings
from outbox.wiring import Backends

if TYPE_CHECKING:
    from outbox.delta.store import DeltaDocumentStore
    from rescuer.runner import RescuePass
    from rescuer.sink import CommandSink, QueueSink


def rescue_delay(settings: Settings, delay: float | None, *, flag: str = "--delay") -> float:
    """The pass's delay: ``delay`` (given as ``flag``) or ``rescue_delay``, within 15 s..1 h and
    no longer than ``log_retention`` (the window end is found among the commits in the log, and
    the trim keeps ``log_retention`` of them)."""
    from rescuer.runner import check_delay

    chosen = check_delay(settings.rescue_delay if delay is None else delay)
    if chosen > settings.log_retention:
        raise ConfigurationError(
            f"{flag} {format_duration(chosen)} is longer than log_retention "
            f"({format_duration(settings.log_retention)}): the trimmed log would not hold a "
            "commit that old, so no pass could find its window",
            hint=f"set log_retention (OUTBOX_LOG_RETENTION) to at least {format_duration(chosen)}"
            f", or set rescue_delay instead of {flag}",
        )
    return chosen


@dataclass
class Rescuer:
    """A rescuer's pass with what it runs on; ``close`` closes them all."""

    settings: Settings
    store: DeltaDocumentStore
    backends: Backends
    sink: CommandSink
    rescue_pass: RescuePass

    def close(self) -> None:
        for part in (self.backends, self.store):
            with contextlib.suppress(OutboxError):  # best effort on shutdown
                part.close()

    def __enter__(self) -> Rescuer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_rescuer(
    settings: Settings,
    *,
    engine: str | None = None,
    delay: float | None = None,
    name: str | None = None,
    clock: Clock | None = None,
    queue_clock: Clock | None = None,
    spark: Any = None,
    wrap_sink: Callable[[QueueSink], CommandSink] | None = None,
) -> Rescuer:
    """The rescuer ``settings`` describe: ``engine`` (default ``rescuer_engine``), ``delay``
    (default ``rescue_delay``), ``name`` (default ``rescuer_name``), on the command queue and the
    checkpoint store the settings choose. ``spark`` is the session of the ``spark`` engine (None:
    its own); ``wrap_sink`` may wrap the production sink (the checker's recording). The queue
    keeps ``queue_clock`` (default: ``clock``): the checker moves only the pass's "now" forward,
    and commands stamped with that time would wait in the queue for the workers' real clock."""
    from rescuer.runner import RescuePass

    chosen_delay = rescue_delay(settings, delay)
    clock = clock or SystemClock()
    backends = Backends(settings, clock=queue_clock or clock, spark=spark)
    store = None
    try:
        store = backends.document_store(clock=clock)
        production = backends.command_sink()
        sink: CommandSink = wrap_sink(production) if wrap_sink is not None else production
        rescue_pass = RescuePass(
            store,
            backends.rescuer_engine(engine),
            backends.checkpoint_store(),
            sink,
            clock=clock,
            delay=chosen_delay,
            name=name or settings.rescuer_name,
        )
        from rescuer import journal

        if journal.kept(settings):
            rescue_pass.journal = journal.SqlRescueJournal(backends.sql_queue.database)
    except BaseException:
        backends.close()
        if store is not None:
            store.close()
        raise
    return Rescuer(settings, store, backends, sink, rescue_pass)

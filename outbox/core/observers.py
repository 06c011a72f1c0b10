"""The observer seam: metrics, tracing and crash points watch the dispatch, worker and rescue
steps, and the hot path calls one hook per step.

Why a seam (dramatiq's middleware is the model): before it, the dispatcher threaded counters,
spans and crash points through its send loop by hand, 19 call sites in one module. Now each step
calls its hook once, and whatever watches (``DispatchMetrics`` through ``MetricsObserver``, the
OpenTelemetry spans through ``TracingObserver``, a proof's crash points through
``StepHookObserver``) is an ``Observer`` that overrides only the steps it cares about.

``Observers`` combines several: at construction it binds, per step, the overriding methods only,
so a step nobody watches costs one call to a no-op, and a step one observer watches is a direct
call to that observer's method (no loop). The steps, in the order a message meets them:

=====================  ====================================================================
``committed``          the Delta commit returned, nothing sent yet (crash point after_commit)
``dispatching``        a context around one dispatch (the ``outbox.dispatch`` span)
``sent``               one send settled: n messages, seconds since the commit (mid_batch)
``send_failed``        a send raised; the document's later messages wait
``batch_fell_back``    a coalesced send failed; its documents are sent one by one
``key_paused``         a message waits behind a paused ordering key
``sends_done``         every send of a dispatch returned (after_send)
``watermark_due``      right before the watermark is written or handed on (during_watermark)
``writing_watermark``  a context around one watermark MERGE (the ``outbox.watermark`` span)
``watermark_written``  a watermark MERGE landed, after ``seconds``
``watermark_failed``   a watermark MERGE failed (the messages are re-sent later, same ids)
``dispatched``         commit to watermark written, for one commit
``commands_enqueued``  retry/deferred commands enqueued (``failed``: the enqueue failed)
``handling``           a context around one batch of commands (the worker's span)
``holding``            the worker holds locked commands and read their documents
``settled``            a command was completed, abandoned, dead-lettered, or its lock lost
``queue_error``        the worker's receive failed
``rescuing``           a context around one rescue pass (the ``outbox.rescue`` span)
``rescued``            a rescue pass finished, with its report
=====================  ====================================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from typing import Any

#: Steps that are context managers (``with observer.dispatching(...)``).
SCOPES = ("dispatching", "writing_watermark", "handling", "rescuing")
#: Steps that are plain calls.
EVENTS = (
    "committed",
    "sent",
    "send_failed",
    "batch_fell_back",
    "key_paused",
    "sends_done",
    "watermark_due",
    "watermark_written",
    "watermark_failed",
    "dispatched",
    "commands_enqueued",
    "holding",
    "settled",
    "queue_error",
    "rescued",
)


class Settlement(StrEnum):
    """How the worker settled a command."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    DEAD_LETTER = "dead_letter"
    LOCK_LOST = "lock_lost"


class Observer:
    """Every step, doing nothing: subclass and override the steps to watch."""

    # --- dispatch ---------------------------------------------------------------------------

    def committed(self) -> None: ...

    def dispatching(
        self, rows: Sequence[Any], system: str
    ) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def sent(self, messages: int, since_commit: float) -> None: ...

    def send_failed(self) -> None: ...

    def batch_fell_back(self) -> None: ...

    def key_paused(self) -> None: ...

    def sends_done(self, messages: int, complete: int, failed: int) -> None: ...

    def watermark_due(self) -> None: ...

    def writing_watermark(self, documents: int) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def watermark_written(self, seconds: float) -> None: ...

    def watermark_failed(self) -> None: ...

    def dispatched(self, seconds: float) -> None: ...

    def commands_enqueued(self, commands: int, *, failed: bool = False) -> None: ...

    # --- the command worker -----------------------------------------------------------------

    def handling(self, received: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def holding(self) -> None: ...

    def settled(self, how: Settlement) -> None: ...

    def queue_error(self) -> None: ...

    # --- the rescuer ------------------------------------------------------------------------

    def rescuing(self, rescuer: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def rescued(self, report: Any) -> None:
        """Called inside ``rescuing``'s context, so a span it opened is the current one."""


class Observers(Observer):
    """Several observers as one: each step calls the observers that override it, in order."""

    def __init__(self, observers: Iterable[Observer]) -> None:
        self.observers = [o for o in observers if o is not None]
        for name in (*SCOPES, *EVENTS):
            hooks = [getattr(o, name) for o in self.observers if _overrides(o, name)]
            if len(hooks) == 1:
                setattr(self, name, hooks[0])  # a direct call: no loop on the hot path
            elif hooks:
                setattr(self, name, _fan_out(name, hooks))
            # none: the base class's no-op stays

    def __repr__(self) -> str:
        return f"Observers({self.observers!r})"


def _overrides(observer: Observer, name: str) -> bool:
    if isinstance(observer, Observers):
        return name in observer.__dict__
    return getattr(type(observer), name) is not getattr(Observer, name)


def _fan_out(name: str, hooks: list[Callable[..., Any]]) -> Callable[..., Any]:
    if name in SCOPES:

        @contextlib.contextmanager
        def scope(*args: Any, **kwargs: Any) -> Iterator[list[Any]]:
            with contextlib.ExitStack() as stack:
                yield [stack.enter_context(h(*args, **kwargs)) for h in hooks]

        return scope

    def event(*args: Any, **kwargs: Any) -> None:
        for h in hooks:
            h(*args, **kwargs)

    return event


#: Watches nothing: what a component runs with when it is given no observer.
NO_OBSERVER = Observer()

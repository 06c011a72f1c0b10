"""Step hooks: the named places between the dispatcher's steps where a proof can step in.

The invariants only mean something if they hold when a process dies *between* two steps, so the
dispatcher and the worker call ``hook.hit(point)`` at each such step. Production runs with
:data:`NO_HOOK`, a method that returns at once; nothing reads the environment or takes a lock on the
hot path. The testing kit's ``outbox.testing.crash_points.CrashPoints`` is the hook the fault
proofs install (``install(crash_points)``) to raise or SIGKILL at a chosen hit.

Points, in the order a message passes them:

``after_commit``
    the Delta commit returned, nothing sent yet;
``mid_batch``
    between two send batches of one dispatch;
``after_send``
    every send settled, the watermark not written;
``during_watermark``
    right before the watermark MERGE;
``worker_holding``
    the worker holds locked commands and has read their documents, nothing sent;
``executor_sent``
    a Spark executor's partition sent a batch (``outbox.app.spark.executors``; its hook is built
    there by ``SparkOutbox.executor_hook``, since an executor is a process of its own).
"""

from __future__ import annotations

from typing import Protocol

from outbox.core.observers import NO_OBSERVER, Observer

POINTS = (
    "after_commit",
    "mid_batch",
    "after_send",
    "during_watermark",
    "worker_holding",
    "executor_sent",
)


class StepHook(Protocol):
    """Called at each named step; may raise (a ``BaseException``) or end the process."""

    def hit(self, point: str) -> None: ...


class _NoHook:
    def hit(self, point: str) -> None:
        return None


#: The hook production code runs with: does nothing.
NO_HOOK: StepHook = _NoHook()

_installed: list[StepHook] = [NO_HOOK]  # one slot: the process-wide default


def install(hook: StepHook | None) -> None:
    """Make ``hook`` the default for dispatchers and workers created from now on (None: none)."""
    _installed[0] = hook if hook is not None else NO_HOOK


def installed() -> StepHook:
    """The hook new dispatchers and workers use unless they are given one."""
    return _installed[0]


class StepHookObserver(Observer):
    """A step hook (the testing kit's crash points) as an observer of the seam: each named point
    is the step it stands after (or before, for ``during_watermark``)."""

    def __init__(self, hook: StepHook) -> None:
        self.hook = hook

    def committed(self) -> None:
        self.hook.hit("after_commit")

    def sent(self, messages: int, since_commit: float) -> None:
        self.hook.hit("mid_batch")

    def sends_done(self, messages: int, complete: int, failed: int) -> None:
        self.hook.hit("after_send")

    def watermark_due(self) -> None:
        self.hook.hit("during_watermark")

    def holding(self) -> None:
        self.hook.hit("worker_holding")


def observer(hook: StepHook | None = None) -> Observer:
    """The observer for ``hook`` (default: the installed one): none at all for ``NO_HOOK``, so
    production runs without even the call."""
    chosen = hook if hook is not None else installed()
    return NO_OBSERVER if chosen is NO_HOOK else StepHookObserver(chosen)

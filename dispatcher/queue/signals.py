"""Graceful stop on SIGTERM/SIGINT, shared by the ``run-dispatcher`` worker and ``Consumer``.

The first signal asks the loop to stop after the work in hand; the handlers are then put back, so a
second signal is handled the default way (SIGTERM ends the process, SIGINT raises
``KeyboardInterrupt``): an operator who presses Ctrl-C twice is not ignored.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger("outbox.queue")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class SignalState:
    """What ``stop_on_signals`` saw: the name of the signal that asked to stop, if any."""

    received: str | None = None


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[SignalState]:
    """Within the block, SIGTERM and SIGINT call ``stop()`` once; a second signal gets the handling
    that was there before. Off the main thread (where Python cannot install handlers) it does
    nothing."""
    state = SignalState()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous: dict[int, Any] = {}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        log.info("received %s: finishing the work in hand, then stopping", name)
        state.received = name
        restore()  # a second signal: default handling
        stop()

    for s in SIGNALS:
        previous[s] = signal.signal(s, handler)
    try:
        yield state
    finally:
        restore()

"""Counters and a latency window for the dispatcher and the worker.

A failure after the commit is never raised to the application (I4), so counting it is the only way
anyone learns of it: these counters are what ``outbox status``, the demo and the benchmark read.
Latencies keep a bounded window (the newest ``window`` samples) so a long-running process does not
grow without bound.

Every counter and latency is also recorded through OpenTelemetry (``outbox.core.telemetry``) here,
at this one choke point, as ``outbox.<counter>`` counters and ``outbox.*.duration`` histograms in
seconds (docs/observability.md lists them): no call site knows about OpenTelemetry. The steps
reach them through ``MetricsObserver``, an observer of the seam (``outbox.core.observers``).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from outbox.core import telemetry
from outbox.core.observers import Observer, Settlement

COUNTERS = (
    "commits_seen",
    "documents_dispatched",
    "documents_failed",
    "messages_sent",
    "send_calls",
    "send_failures",
    "coalesced_fallbacks",
    "watermark_merges",
    "watermark_failures",
    "commands_enqueued",
    "enqueue_failures",
    "commands_completed",
    "commands_abandoned",
    "commands_dead_lettered",
    "lock_lost",
)

#: latency window -> (OpenTelemetry histogram, description); unit: seconds.
HISTOGRAMS = {
    "settle_latency": ("outbox.dispatch.settle.duration", "commit to a send settled, per send"),
    "watermark_latency": ("outbox.watermark.duration", "one watermark MERGE"),
    "dispatch_latency": ("outbox.dispatch.duration", "commit to watermark written, per commit"),
}


def _count(name: str, n: int) -> None:
    if n:
        telemetry.instrument("counter", f"outbox.{name}", "1", name.replace("_", " ")).add(n)


def _observe(window: str, seconds: float) -> None:
    metric, description = HISTOGRAMS[window]
    telemetry.instrument("histogram", metric, "s", description).record(seconds)


@dataclass
class DispatchMetrics:
    """Thread-safe counters (names in ``COUNTERS``) and latency windows in seconds."""

    window: int = 10_000
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    settle_latency: deque[float] = field(default_factory=deque)  # commit -> send settled
    watermark_latency: deque[float] = field(default_factory=deque)  # one watermark MERGE
    dispatch_latency: deque[float] = field(default_factory=deque)  # commit -> watermark written
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.settle_latency = deque(maxlen=self.window)
        self.watermark_latency = deque(maxlen=self.window)
        self.dispatch_latency = deque(maxlen=self.window)

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + n
        _count(name, n)

    def observe_settle(self, seconds: float, n: int = 1) -> None:
        """Record ``n`` messages that settled ``seconds`` after their commit, in one send.

        The window keeps one sample per message; the OpenTelemetry histogram gets one per send,
        as OpenTelemetry's messaging ``operation.duration`` does (messages are counted by
        ``outbox.messages_sent``). Why: the SDK has no weighted record, and recording a
        1,000-message send 1,000 times cost 13 ms, a fifth of the dispatch it measured
        (measured by hand; issue 18)."""
        with self._lock:
            self.settle_latency.extend([seconds] * n)
        _observe("settle_latency", seconds)

    def observe_watermark(self, seconds: float) -> None:
        with self._lock:
            self.watermark_latency.append(seconds)
        _observe("watermark_latency", seconds)

    def observe_dispatch(self, seconds: float) -> None:
        with self._lock:
            self.dispatch_latency.append(seconds)
        _observe("dispatch_latency", seconds)

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)

    def snapshot(self) -> dict[str, Any]:
        """Counters plus p50/p99 (milliseconds) of each latency window."""
        with self._lock:
            out: dict[str, Any] = dict(self.counts)
            for name in ("settle_latency", "watermark_latency", "dispatch_latency"):
                values = sorted(getattr(self, name))
                out[f"{name}_p50_ms"] = _percentile(values, 0.50) * 1000
                out[f"{name}_p99_ms"] = _percentile(values, 0.99) * 1000
            return out

    def reset(self) -> None:
        with self._lock:
            self.counts = dict.fromkeys(COUNTERS, 0)
            self.settle_latency.clear()
            self.watermark_latency.clear()
            self.dispatch_latency.clear()


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class MetricsObserver(Observer):
    """``DispatchMetrics`` as an observer of the dispatch and worker steps: each step counts and
    times itself here, the only place that knows the counters' names."""

    def __init__(self, metrics: DispatchMetrics) -> None:
        self.metrics = metrics

    def committed(self) -> None:
        self.metrics.inc("commits_seen")

    def sent(self, messages: int, since_commit: float) -> None:
        self.metrics.inc("send_calls")
        self.metrics.observe_settle(since_commit, messages)

    def send_failed(self) -> None:
        self.metrics.inc("send_failures")

    def batch_fell_back(self) -> None:
        self.metrics.inc("coalesced_fallbacks")

    def key_paused(self) -> None:
        self.metrics.inc("key_paused_stops")

    def sends_done(self, messages: int, complete: int, failed: int) -> None:
        self.metrics.inc("messages_sent", messages)
        self.metrics.inc("documents_dispatched", complete)
        self.metrics.inc("documents_failed", failed)

    def watermark_written(self, seconds: float) -> None:
        self.metrics.inc("watermark_merges")
        self.metrics.observe_watermark(seconds)

    def watermark_failed(self) -> None:
        self.metrics.inc("watermark_failures")

    def dispatched(self, seconds: float) -> None:
        self.metrics.observe_dispatch(seconds)

    def commands_enqueued(self, commands: int, *, failed: bool = False) -> None:
        self.metrics.inc("enqueue_failures" if failed else "commands_enqueued", commands)

    def settled(self, how: Settlement) -> None:
        self.metrics.inc(_SETTLED[how])

    def queue_error(self) -> None:
        self.metrics.inc("worker_queue_errors")


_SETTLED = {
    Settlement.COMPLETE: "commands_completed",
    Settlement.ABANDON: "commands_abandoned",
    Settlement.DEAD_LETTER: "commands_dead_lettered",
    Settlement.LOCK_LOST: "lock_lost",
}

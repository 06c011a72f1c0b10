"""Fault-injecting wrappers for tests and the demo: a transport, and a command sink.

Real brokers fail in a handful of ways that matter to the outbox: a send fails as a whole (busy,
unreachable), one destination refuses messages (deleted queue), everything is down for a while, a
send is slow, or the sender dies after the broker took part of a batch. Each has a knob here, and
every knob is deterministic (counted, or drawn from a seeded RNG) so a failing test replays.
Latency goes through the injected clock, so tests with a ``ManualClock`` never sleep.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.commands import ProcessDocument
from dispatcher.transports.base import Capabilities, Transport, TransportMessage
from outbox.core.clock import Clock, SystemClock
from outbox.core.errors import (
    PermanentTransportError,
    RetryableTransportError,
    TransportError,
    TransportUnavailableError,
)
from outbox.testing.crash_points import InjectedCrash
from rescuer.sink import InMemorySink


class FaultyTransport:
    """Wraps ``inner`` and injects failures. Knobs can be changed while sends are running."""

    def __init__(
        self, inner: Transport, *, clock: Clock | None = None, seed: int | None = None
    ) -> None:
        self.inner = inner
        self._clock = clock or SystemClock()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._fail_calls: dict[int, bool] = {}  # send call number -> permanent?
        self._fail_destinations: dict[str, bool] = {}
        self._fail_messages: dict[str, bool] = {}
        self._outage = False
        self._rate = 0.0
        self._rate_permanent = False
        self._latency = 0.0
        self._jitter = 0.0
        self._partial: tuple[int, bool] | None = None  # (messages to deliver, crash instead?)
        self.calls = 0  # send() calls seen, failed or not
        self.failures = 0

    @property
    def atomic_batches(self) -> bool:
        """Atomic as long as no partial delivery is armed (then it breaks the batch on purpose)."""
        from dispatcher.dispatch import atomic_batches

        return atomic_batches(self.inner) and self._partial is None

    @property
    def coalesce_sends(self) -> bool:
        return Capabilities.of(self.inner).coalesce_sends

    # --- knobs --------------------------------------------------------------------------------

    def fail_nth(self, n: int, *, permanent: bool = False) -> None:
        """Fail the ``n``-th ``send`` call counted from the wrapper's creation (1-based)."""
        with self._lock:
            self._fail_calls[n] = permanent

    def fail_next(self, count: int = 1, *, permanent: bool = False) -> None:
        """Fail the next ``count`` send calls."""
        with self._lock:
            for i in range(self.calls + 1, self.calls + 1 + count):
                self._fail_calls[i] = permanent

    def fail_destination(self, destination: str, *, permanent: bool = True) -> None:
        with self._lock:
            self._fail_destinations[destination] = permanent

    def fail_message(self, message_id: str, *, permanent: bool = False) -> None:
        with self._lock:
            self._fail_messages[message_id] = permanent

    def outage(self, on: bool = True) -> None:
        """While on, every send fails as retryable (the broker is unreachable)."""
        with self._lock:
            self._outage = on

    def failure_rate(self, p: float, *, permanent: bool = False) -> None:
        """Fail each send with probability ``p``, drawn from the seeded RNG."""
        with self._lock:
            self._rate, self._rate_permanent = p, permanent

    def latency(self, seconds: float, *, jitter: float = 0.0) -> None:
        """Every send waits ``seconds`` (+ up to ``jitter``) on the clock before it settles."""
        with self._lock:
            self._latency, self._jitter = seconds, jitter

    def deliver_partially(self, messages: int, *, crash: bool = False) -> None:
        """The next send passes only its first ``messages`` messages on, then fails.

        With ``crash=True`` it raises ``InjectedCrash`` instead: the sender died mid-batch after the
        broker had taken part of it.
        """
        with self._lock:
            self._partial = (messages, crash)

    def heal(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._fail_calls.clear()
            self._fail_destinations.clear()
            self._fail_messages.clear()
            self._outage = False
            self._rate = 0.0
            self._latency = self._jitter = 0.0
            self._partial = None

    # --- the transport --------------------------------------------------------------------------

    def _decide(self, batch: Sequence[TransportMessage]) -> _Plan:
        """What this send call does: wait, deliver a prefix, then fail (or pass it all on)."""
        with self._lock:
            self.calls += 1
            first = batch[0].message_id if batch else None
            plan = _Plan(self._latency + (self._rng.random() * self._jitter if self._jitter else 0))
            if self._outage:
                plan.error = TransportUnavailableError(
                    f"message {first}: injected outage (the broker is unreachable)",
                    message_id=first,
                    hint="this failure was injected by FaultyTransport; call outage(False)",
                )
                return plan
            if self.calls in self._fail_calls:
                plan.error = _error(self._fail_calls.pop(self.calls), first, f"send #{self.calls}")
                return plan
            if self._rate and self._rng.random() < self._rate:
                plan.error = _error(self._rate_permanent, first, "random failure")
                return plan
            for m in batch:
                permanent = self._fail_destinations.get(m.destination)
                if permanent is not None:  # retryable: the destination does not answer
                    plan.error = _error(
                        permanent, m.message_id, f"destination {m.destination!r}", unavailable=True
                    )
                    return plan
                permanent = self._fail_messages.get(m.message_id)
                if permanent is not None:
                    plan.error = _error(permanent, m.message_id, "this message")
                    return plan
            if self._partial is not None and batch:
                n, plan.crash = self._partial
                self._partial = None
                plan.deliver_first = min(n, len(batch))
                failing = batch[min(n, len(batch) - 1)].message_id
                plan.error = RetryableTransportError(
                    f"message {failing}: injected failure after delivering {n} message(s)",
                    message_id=failing,
                )
            return plan

    def send(self, batch: Sequence[TransportMessage]) -> None:
        plan = self._decide(batch)
        if plan.delay > 0:
            self._clock.sleep(plan.delay)
        if plan.error is None:
            self.inner.send(batch)
            return
        if plan.deliver_first:
            self.inner.send(batch[: plan.deliver_first])
        with self._lock:
            self.failures += 1
        if plan.crash:
            raise InjectedCrash("mid_batch")
        raise plan.error

    def close(self) -> None:
        self.inner.close()


@dataclass
class _Plan:
    delay: float
    error: TransportError | None = None
    deliver_first: int = 0
    crash: bool = False


def _error(
    permanent: bool, message_id: str | None, what: str, *, unavailable: bool = False
) -> TransportError:
    cls: type[TransportError] = (
        PermanentTransportError
        if permanent
        else TransportUnavailableError
        if unavailable
        else RetryableTransportError
    )
    return cls(
        f"message {message_id}: injected {'permanent' if permanent else 'retryable'} failure "
        f"({what})",
        message_id=message_id,
        hint="this failure was injected by FaultyTransport; call heal() to stop it",
    )


class FaultySink(InMemorySink):
    """The in-memory command sink with a fault: ``fail_next`` is raised by the next enqueue
    (before anything of it is kept), then cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: BaseException | None = None

    def enqueue(self, commands: Sequence[ProcessDocument]) -> int:
        error, self.fail_next = self.fail_next, None
        if error is not None:
            raise error
        return super().enqueue(commands)

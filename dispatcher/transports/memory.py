"""The in-memory reference transport: every delivery recorded, for fast tests, docs and the demo.

It passes the same contract suite as the SQL transport, so a test that runs against it says
something true about the real ones. It records *every* accepted send, including re-sends, because
the invariants (at least once, first deliveries in order, duplicates share a message_id) are checked
on the raw delivery log. With ``detect_duplicates=True`` it behaves like a broker with duplicate
detection: a repeated message_id is accepted (the send succeeds) but not delivered again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from dispatcher.transports.base import TransportMessage
from outbox.core.errors import ClosedError, UnknownDestinationError, ValidationError

#: The one type a batch is made of, in the usual case (checked per type, then per message only
#: when another type is in it).
_PLAIN = frozenset({TransportMessage})


class InMemoryTransport:
    """Thread-safe list of deliveries. A batch is atomic: validated first, then all appended."""

    #: A batch may mix sessions and destinations and is all-or-nothing (the dispatcher may send
    #: many documents in one call and fall back to per-document sends on failure).
    atomic_batches = True

    def __init__(
        self,
        *,
        detect_duplicates: bool = False,
        destinations: Sequence[str] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._detect = detect_duplicates
        self._known = set(destinations) if destinations is not None else None
        self._seen: set[str] = set()
        self._closed = False
        self.deliveries: list[TransportMessage] = []  # what consumers received, in order
        self.sends = 0  # number of successful send() calls
        self.duplicates_dropped = 0

    def send(self, batch: Sequence[TransportMessage]) -> None:
        if self._closed:
            raise ClosedError("the in-memory transport is closed", hint="build a new transport")
        if set(map(type, batch)) - _PLAIN:  # the usual batch: one look per type, not per message
            for m in batch:
                if not isinstance(m, TransportMessage):
                    raise ValidationError(f"send() takes TransportMessage objects, got {type(m)!r}")
        if self._known is not None:
            for m in batch:
                if m.destination not in self._known:
                    raise UnknownDestinationError(
                        f"message {m.message_id}: no destination named {m.destination!r}",
                        message_id=m.message_id,
                        hint=f"use one of {sorted(self._known)} or declare it on the transport",
                    )
        with self._lock:
            if not self._detect:  # every message delivered: the ids are not needed
                self.deliveries.extend(batch)
                self.sends += 1
                return
            for m in batch:
                if m.message_id in self._seen:
                    self.duplicates_dropped += 1
                    continue
                self._seen.add(m.message_id)
                self.deliveries.append(m)
            self.sends += 1

    # --- inspection (tests, docs, the checker) ---------------------------------------------------

    def messages(self, destination: str | None = None) -> list[TransportMessage]:
        with self._lock:
            return [m for m in self.deliveries if destination in (None, m.destination)]

    def message_ids(self) -> list[str]:
        with self._lock:
            return [m.message_id for m in self.deliveries]

    def clear(self) -> None:
        with self._lock:
            self.deliveries.clear()
            self._seen.clear()
            self.sends = 0
            self.duplicates_dropped = 0

    def close(self) -> None:
        self._closed = True

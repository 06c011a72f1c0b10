"""Keeping leases alive in the background: the one mechanism behind the queue's message locks
(``lock_renewer.LockRenewer``), the inbox's claims (``inbox.ClaimKeeper``) and the claim log's
claims (``claimed.ClaimedReceive``).

Each of them holds things under a lease that ends, while work runs that may outlive it. A thread
looks every ``check_interval`` seconds and renews each lease with half its length or less left.
The pace is real time; what is due is decided by the injected clock, so tests move time instead
of waiting for it. A renewal says one of three things:

* renewed, until a new end;
* ``Renewal.LOST``: taken over, settled or released meanwhile; there is nothing more to keep, so
  the lease is let go (``on_lost`` is told, if it was still held);
* ``Renewal.LATER``: not renewed this time (a failure worth retrying, already logged by the one
  who renews); the next look tries again, while the lease lasts.

Why one: the three had grown the same thread, the same half-lease rule and the same race (a
renewal that lands after the work let the lease go must not hold it again) three times.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import Enum
from typing import Generic, TypeVar

from outbox.core.clock import Clock

K = TypeVar("K", bound=Hashable)


class Renewal(Enum):
    """What a renewal says when it did not renew (see the module's docstring)."""

    LOST = "lost"
    LATER = "later"


class LeaseRenewer(Generic[K]):
    """Leases by key, each with its end, and the thread that renews those due.

    ``renew(key, now)`` renews one lease (``now`` is the clock's time of the look). The leases
    are what ``hold`` gave, or, with ``track``, exactly what ``track()`` lists at each look (key
    and the end it knows; an end of None is never renewed), each keeping the end its last
    renewal gave. Thread-safe: the work that holds the leases lets them go from its own threads.
    """

    def __init__(
        self,
        renew: Callable[[K, datetime], datetime | Renewal],
        clock: Clock,
        lease: timedelta,
        *,
        name: str,
        check_interval: float = 1.0,
        on_lost: Callable[[K], None] | None = None,
        track: Callable[[], Iterable[tuple[K, datetime | None]]] | None = None,
    ) -> None:
        self.clock = clock
        self.lease = lease
        self.check_interval = check_interval
        self.renewals = 0  # leases renewed while still held
        self._renew = renew
        self._name = name
        self._on_lost = on_lost
        self._track = track
        self._ends: dict[K, datetime] = {}
        self._guard = threading.Lock()

    def hold(self, key: K, until: datetime) -> None:
        """Keep ``key``'s lease, which ends at ``until``, alive until it is forgotten."""
        with self._guard:
            self._ends[key] = until

    def end(self, key: K) -> datetime | None:
        """When ``key``'s lease ends as last renewed; None when it is not held."""
        with self._guard:
            return self._ends.get(key)

    def forget(self, key: K) -> None:
        """Stop renewing ``key`` (its work returned); its lease ends by itself."""
        with self._guard:
            self._ends.pop(key, None)

    @contextmanager
    def renewing(self) -> Iterator[None]:
        """Renew in the background for the ``with`` block (the thread is joined at its end)."""
        done = threading.Event()
        thread = threading.Thread(target=self._loop, args=(done,), name=self._name, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _loop(self, done: threading.Event) -> None:
        while not done.wait(self.check_interval):
            self.renew_due()

    def renew_due(self) -> None:
        """One look: renew every lease with half its length or less left."""
        now = self.clock.now()
        if self._track is not None:
            tracked = [(k, until) for k, until in self._track() if until is not None]
            with self._guard:
                self._ends = {k: self._ends.get(k, until) for k, until in tracked}
        half = self.lease / 2
        with self._guard:
            due = [k for k, until in self._ends.items() if until - now <= half]
        for key in due:
            outcome = self._renew(key, now)
            if outcome is Renewal.LATER:
                continue
            with self._guard:
                if key not in self._ends:
                    continue  # its work let it go meanwhile: not held again
                if isinstance(outcome, datetime):
                    self._ends[key] = outcome
                    self.renewals += 1
                    continue
                del self._ends[key]
            if self._on_lost is not None:
                self._on_lost(key)

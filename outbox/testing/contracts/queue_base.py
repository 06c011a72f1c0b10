"""The queue contract's common ground: the limits ``make_queue`` must configure, the message
helpers, and the base class with the feature flags, the factory and the fixtures. Each semantic's
tests are a module of their own (``queue_sending``, ``queue_sessions``, ``queue_defer``,
``queue_settlement``, ``queue_admin``); ``queue.QueueContract`` combines them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.queue.messages import QueueMessage, ReceivedMessage
from outbox.core.clock import ManualClock

#: The limits ``make_queue`` must configure; the tests count on them.
LOCK_DURATION = 30.0
MAX_DELIVERY_COUNT = 3
DUPLICATE_DETECTION_WINDOW = 600.0
MAX_BODY_BYTES = 1024


def msg(mid: str, session: str | None = None, **kw: object) -> QueueMessage:
    return QueueMessage(body=f"body-{mid}".encode(), message_id=mid, session_id=session, **kw)  # type: ignore[arg-type]


def ids(messages: list[ReceivedMessage]) -> list[str]:
    return [m.message_id for m in messages]


class QueueContractBase:
    """What every part of the contract shares: the feature flags, the factory to override, the
    fixtures. Subclass ``queue.QueueContract``, which holds every part, not this."""

    #: session FIFO with one lock holder per session, and ``receive(session_id=...)``
    supports_sessions = True
    #: ``not_before`` and ``abandon(delay=...)``
    supports_scheduled_delivery = True
    #: ``receive_and_delete``
    supports_receive_and_delete = True
    #: ``get_dead_letter``, ``count_dead_letters``, ``requeue`` and ``purge``
    supports_dead_letter_admin = True
    #: ``forget_expired_duplicates`` (housekeeping of the duplicate-detection ids)
    supports_duplicate_cleanup = True
    #: ``reopen_queue``: a second instance over the same storage sees the same messages
    supports_reopen = True
    #: ``defer`` and ``receive_deferred`` (the fourth peek-lock settlement)
    supports_defer = True
    #: ``stats()`` counts deferred messages apart (Service Bus's runtime properties do not)
    supports_deferred_count = True

    def make_queue(self, clock: ManualClock) -> Any:
        """A fresh, empty queue on ``clock``, configured with ``LOCK_DURATION``,
        ``MAX_DELIVERY_COUNT``, ``DUPLICATE_DETECTION_WINDOW`` and ``MAX_BODY_BYTES``."""
        raise NotImplementedError

    def reopen_queue(self) -> Any:
        """Another instance over the storage of the last ``make_queue`` (defaults are fine)."""
        raise NotImplementedError

    def require(self, *features: str) -> None:
        """Skip the running test unless the backend claims every ``supports_<feature>``."""
        for feature in features:
            if not getattr(self, f"supports_{feature}"):
                pytest.skip(f"the backend does not claim {feature} (supports_{feature} = False)")

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def queue(self, clock: ManualClock) -> Iterator[Any]:
        q = self.make_queue(clock)
        yield q
        q.close()

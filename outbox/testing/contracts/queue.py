"""The queue contract: every Service-Bus-like semantic the outbox relies on (docs/sql_queue.md):
duplicate detection, session FIFO with one holder, scheduled delivery, peek-lock
settlement, delivery counts and dead letters.

Why it ships: the dispatcher worker and the rescuer trust these semantics blindly, so a queue
backend (another database, a broker adapter) is only a drop-in when it passes them all. Subclass
``QueueContract``, implement ``make_queue`` (honouring the limits below) and ``reopen_queue``, and
set to False the ``supports_*`` flags your backend does not claim: those tests skip.

Time only moves when a test advances the ``ManualClock`` handed to ``make_queue``; nothing sleeps.
The queue under test needs ``SqlQueue``'s public surface (send, receive, complete, abandon, ...).

``QueueContract`` is still the one class a backend subclasses: it combines one part per semantic
(``queue_sending``, ``queue_sessions``, ``queue_defer``, ``queue_settlement``, ``queue_admin``),
all on the common ground of ``queue_base``, so no third party assembles the suite or misses a part.
"""

from __future__ import annotations

from outbox.testing.contracts.queue_admin import QueueAdminContract
from outbox.testing.contracts.queue_base import (
    DUPLICATE_DETECTION_WINDOW,
    LOCK_DURATION,
    MAX_BODY_BYTES,
    MAX_DELIVERY_COUNT,
    ids,
    msg,
)
from outbox.testing.contracts.queue_defer import QueueDeferContract
from outbox.testing.contracts.queue_sending import QueueSendingContract
from outbox.testing.contracts.queue_sessions import QueueSessionsContract
from outbox.testing.contracts.queue_settlement import QueueSettlementContract

__all__ = [
    "DUPLICATE_DETECTION_WINDOW",
    "LOCK_DURATION",
    "MAX_BODY_BYTES",
    "MAX_DELIVERY_COUNT",
    "QueueContract",
    "ids",
    "msg",
]


class QueueContract(
    QueueSendingContract,
    QueueSessionsContract,
    QueueDeferContract,
    QueueSettlementContract,
    QueueAdminContract,
):
    """Subclass as ``Test<YourQueue>``; override ``make_queue`` (and ``reopen_queue``)."""

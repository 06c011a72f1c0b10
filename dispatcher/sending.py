"""What one send is made of, for the dispatcher (``dispatch.py``): a stored message as the
transport's message, whether documents may share a send (the transport's declared
``Capabilities``), and the destinations that did not answer earlier in the same dispatch.

Why apart from ``dispatch.py``: these say what a send is and may be, whoever sends; the
dispatcher decides which sends to make, in which order, and what their outcome means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dispatcher.outcomes import Plan
from dispatcher.queue.key_lines import Key
from dispatcher.transports.base import Capabilities, Transport, TransportMessage
from outbox.core.errors import TransportUnavailableError
from outbox.core.model import DocumentRow, OutboxMessage


def atomic_batches(transport: Transport) -> bool:
    """Does ``transport`` take a batch all-or-nothing, across sessions and destinations?

    A transport says so with ``atomic_batches = True`` (the SQL queue transport: one transaction
    per send; ``base.Capabilities``); without it, batches are sent one document at a time.
    """
    return Capabilities.of(transport).atomic_batches


def coalesces(transport: Transport) -> bool:
    """May documents share one ``send``? Atomic transports, and those that declare
    ``coalesce_sends = True`` (many records per round trip; "Coalescing" in ``dispatch.py``)."""
    return Capabilities.of(transport).coalesces


def to_transport_message(message: OutboxMessage, doc_id: str) -> TransportMessage:
    """Map a stored message onto the transport's fields (Service Bus names in parentheses).

    The ordering key becomes the session (``session_id``); without one the document id is used,
    which gives per-document order. ``deliver_at`` becomes the scheduled time
    (``scheduled_enqueue_time_utc``), the message type the ``subject``; ``created_at`` goes
    along as it was stored.
    """
    # positional, in the fields' order: a dispatch builds one per message (by keywords, a
    # tenth of a microsecond more each)
    return TransportMessage(
        message.message_id,
        message.destination,
        message.body.encode("utf-8"),
        message.type,
        message.content_type,
        message.ordering_key or doc_id,
        message.deliver_at,
        message.correlation_id,
        message.headers,  # shared, not copied: transports only read them (base.py)
        message.created_at,
    )


def transport_messages(plans: Sequence[Plan]) -> list[TransportMessage]:
    """``to_transport_message`` of every message of ``plans``, in order, inline (one shared
    send's batch: a call per message was a tenth of its cost)."""
    return [
        TransportMessage(
            m.message_id,
            m.destination,
            m.body.encode("utf-8"),
            m.type,
            m.content_type,
            m.ordering_key or row.id,
            m.deliver_at,
            m.correlation_id,
            m.headers,
            m.created_at,
        )
        for row, msgs in plans
        for m in msgs
    ]


def pending_plans(rows: Iterable[DocumentRow]) -> list[Plan]:
    """Each row with messages to send, with them (``DocumentRow.pending``; a row's one message,
    the usual case, as the row's own outbox list: no list built for it, and one object fewer per
    message for the collector to count; nothing downstream changes a plan's list)."""
    plans: list[Plan] = []
    for r in rows:
        low, high = r.dispatched_seq, r.last_seq
        if high <= low:
            continue
        out = r.outbox
        if len(out) == 1:
            if low < out[0].seq <= high:
                plans.append((r, out))
        elif p := r.pending():
            plans.append((r, p))
    return plans


def keys_of(plans: Sequence[Plan]) -> set[Key]:
    """The ordering keys of ``plans``' messages, each once (``dispatcher.keys.key_of``, inline:
    a dispatch gathers them once for all its turns and its read of the paused keys)."""
    return {(m.destination, m.ordering_key or row.id) for row, msgs in plans for m in msgs}


def shared(plans: Sequence[Plan]) -> bool:
    """May a key span documents here: has a message a session other than its own document's?
    Only then does the order between documents matter (a session named after another document
    is that document's key too, so "other than its own" is the test, not "a session at all")."""
    return any(
        m.ordering_key is not None and m.ordering_key != row.id for row, msgs in plans for m in msgs
    )


def written_at(plan: Plan) -> float:
    """When the first pending message of a plan was written (``created_at``; 0 when unknown, so
    such plans keep their order, the sort being stable)."""
    at = plan[1][0].created_at
    return 0.0 if at is None else at.timestamp()


def chunked(plans: list[Plan], limit: int) -> list[list[Plan]]:
    """Whole documents, in order, grouped into sends of at most ``limit`` messages (a document
    with more goes alone: it is sent ``limit`` at a time on its own)."""
    chunks: list[list[Plan]] = []
    current: list[Plan] = []
    count = 0
    for plan in plans:
        n = len(plan[1])
        if current and count + n > limit:
            chunks.append(current)
            current, count = [], 0
        current.append(plan)
        count += n
    if current:
        chunks.append(current)
    return chunks


class Outage:
    """The destinations that did not answer a send in one dispatch (``TransportUnavailableError``)
    and why: a later send there in the same dispatch fails at once instead of waiting out another
    timeout, so a dispatch during an outage returns within about one send timeout whatever its
    size (the worker and the rescuer send the rest). A failure of one message (any other error)
    says nothing about the destination and is not recorded: other documents go on (I2)."""

    def __init__(self) -> None:
        self._failed: dict[str, Exception] = {}

    def check(self, batch: Sequence[TransportMessage]) -> None:
        if not self._failed:
            return
        for m in batch:
            error = self._failed.get(m.destination)
            if error is not None:
                raise TransportUnavailableError(
                    f"not sent: a send to {m.destination!r} failed earlier in this dispatch "
                    f"({error})",
                    message_id=m.message_id,
                )

    def failed(self, batch: Sequence[TransportMessage], error: Exception) -> None:
        for m in batch:
            self._failed.setdefault(m.destination, error)

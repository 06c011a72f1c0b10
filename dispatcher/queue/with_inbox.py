"""A consumer's message with an inbox and a handler without a ``Connection``: claim the id, run
the handler, then record and complete (``consumer``'s docstring, the second mode).

Why apart from ``consumer.py``: this path completes each message with its record (one
transaction with the SQL inbox in the queue's database), not through the consumer's batch
completer, and shares nothing else with it but the settlement helpers it is handed (a
``Consumer`` protocol, as ``in_transaction`` and ``claimed`` do).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dispatcher.queue.inbox import ClaimKeeper, Inbox, InboxClaim, TransactionalInbox
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.clock import Clock

log = logging.getLogger("outbox.queue.consumer")  # the consumer's, as its other lines


class Consumer(Protocol):
    """What this path uses of ``consumer.Consumer`` (a Protocol: the consumer imports this
    module, so this module must not import it back)."""

    queue: SqlQueue
    clock: Clock
    inbox: Inbox | None
    processed: int
    _joined: TransactionalInbox | None

    def _owner(self, msg: ReceivedMessage) -> str: ...

    def _call(self, msg: ReceivedMessage) -> Callable[[], None] | None: ...

    def _wait_for(self, msg: ReceivedMessage, claim: InboxClaim) -> None: ...

    def _abandon(self, msg: ReceivedMessage, error: Exception) -> None: ...

    def _settle(self, action: Any, msg: ReceivedMessage) -> None: ...


def run_with_inbox(consumer: Consumer, keeper: ClaimKeeper, msg: ReceivedMessage) -> None:
    """Claim, handle, then record and complete ``msg`` (or settle it as the claim says)."""
    owner = consumer._owner(msg)
    if not _claim(consumer, keeper, msg, owner):
        return
    try:
        failed = consumer._call(msg)
    finally:
        keeper.forget(msg.message_id, owner)
    if failed is not None:  # released first, so the retry finds the id free
        keeper.release(msg.message_id, owner)
        failed()
        return
    _complete_with_inbox(consumer, keeper, msg, owner)
    consumer.processed += 1


def _claim(consumer: Consumer, keeper: ClaimKeeper, msg: ReceivedMessage, owner: str) -> bool:
    """Claim the id before the handler runs; False when this delivery was settled instead:
    handled (completed), held by another live claim (waits) or the inbox failed."""
    try:
        claim = keeper.take(msg.message_id, owner)
    except Exception as e:  # nothing runs without a claim
        consumer._abandon(msg, e)
        return False
    if claim.handled:
        log.info("message %s was already handled; dropping the repeat", msg.message_id)
        consumer._settle(consumer.queue.complete, msg)
        return False
    if claim.held:
        consumer._wait_for(msg, claim)
        return False
    return True


def _complete_with_inbox(
    consumer: Consumer, keeper: ClaimKeeper, msg: ReceivedMessage, owner: str
) -> None:
    """Record, then complete. The SQL inbox in the queue's database does both in one
    transaction; a lost lock still records (the handler succeeded), so the redelivery is
    dropped. Another inbox records first: a failed record releases the claim and abandons
    (the handler runs again: at-least-once); a lost completion after the record is
    redelivered and dropped by the inbox."""
    assert consumer.inbox is not None
    queue, clock, joined = consumer.queue, consumer.clock, consumer._joined
    if joined is None:
        try:
            consumer.inbox.record(msg.message_id, at=clock.now())
        except Exception as e:
            keeper.release(msg.message_id, owner)
            consumer._abandon(msg, e)
            return
        consumer._settle(queue.complete, msg)
        return
    try:
        with queue.database.write("complete a message") as conn:
            joined.record_in(conn, msg.message_id, at=clock.now())
            if not queue.receiver.complete_in(conn, msg, clock.now()):
                log.warning(
                    "message %s: lock lost before completion; recorded, so its redelivery "
                    "is dropped by the inbox",
                    msg.message_id,
                )
    except Exception as e:  # neither recorded nor completed: the handler runs again
        keeper.release(msg.message_id, owner)
        consumer._abandon(msg, e)

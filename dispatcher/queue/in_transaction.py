"""A consumer's handler that takes a ``Connection``: the queue's completion, the SQL inbox's claim
and record (when the consumer has one) and the handler's own work commit in one transaction of
the queue's database, or none of them does (``consumer``'s docstring, the first mode).

Why apart from ``consumer.py``: this path shares nothing with the others but the settlement
helpers it is handed (a ``Consumer`` protocol, as ``claimed`` does); inside the transaction it
orders its own steps and keeps a handler's failure apart from the queue's.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.queue.messages import DeferMessage
from outbox.core.errors import LockLostError

if TYPE_CHECKING:
    from dispatcher.queue.inbox import InboxClaim, TransactionalInbox
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.queue.sql_queue import SqlQueue
    from outbox.core.clock import Clock

log = logging.getLogger("outbox.queue.consumer")  # the consumer's, as its other lines


class Consumer(Protocol):
    """What this path uses of ``consumer.Consumer`` (a Protocol: the consumer imports this
    module, so this module must not import it back)."""

    queue: SqlQueue
    clock: Clock
    handler: Any
    inbox_lease: timedelta
    processed: int
    _joined: TransactionalInbox | None

    def _owner(self, msg: ReceivedMessage) -> str: ...

    def _wait_for(self, msg: ReceivedMessage, claim: InboxClaim) -> None: ...

    def _settle_failure(self, msg: ReceivedMessage, error: BaseException) -> None: ...

    def _abandon(self, msg: ReceivedMessage, error: Exception) -> None: ...


class _ClaimHeldElsewhere(Exception):
    """Rolls a ``Connection`` handler's transaction back: another delivery holds the claim."""

    def __init__(self, claim: InboxClaim) -> None:
        super().__init__(f"held by {claim.owner} until {claim.lease_until}")
        self.claim = claim


class _HandlerFailed(Exception):
    """Carries a handler's exception out of the queue's transaction untranslated: the queue only
    translates its own driver errors, so a handler's ``IntegrityError`` stays one."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def takes_connection(handler: Callable[..., Any]) -> bool:
    """Does ``handler`` take a ``Connection`` after the message (two positional parameters)?"""
    params = [
        p
        for p in inspect.signature(handler).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(params) >= 2


def run_in_transaction(consumer: Consumer, msg: ReceivedMessage) -> None:
    """Handle ``msg`` with ``consumer``'s ``Connection`` handler. Complete first, inside the
    handler's transaction: once the delete is in (uncommitted), no other receiver can take the
    row, so the handler needs no lock renewal; a rollback puts everything back."""
    db = consumer.queue.database
    try:
        with db.write("handle a message") as conn:
            if not consumer.queue.receiver.complete_in(conn, msg, consumer.clock.now()):
                raise LockLostError(f"message {msg.message_id}: lock lost before handling")
            if consumer._joined is not None:
                claim = consumer._joined.claim_in(
                    conn,
                    msg.message_id,
                    consumer._owner(msg),
                    lease=consumer.inbox_lease,
                    at=consumer.clock.now(),
                )
                if claim.handled:  # the delete above completes the repeat
                    log.info("message %s was already handled; dropping it", msg.message_id)
                    return
                if claim.held:  # a consumer of this name without a Connection handler
                    raise _ClaimHeldElsewhere(claim)
            try:
                result = consumer.handler(msg, conn)
            except Exception as e:  # the handler's own: kept apart from the queue's errors
                raise _HandlerFailed(e) from e
            if isinstance(result, DeferMessage):  # roll the handler's work back, then defer
                raise _HandlerFailed(result)
            if consumer._joined is not None:
                consumer._joined.record_in(conn, msg.message_id, at=consumer.clock.now())
    except _ClaimHeldElsewhere as held:
        consumer._wait_for(msg, held.claim)
        return
    except _HandlerFailed as failed:
        consumer._settle_failure(msg, failed.error)
        return
    except LockLostError as e:
        log.warning("%s; it will be redelivered", e)
        return
    except Exception as e:  # the queue's own statements or the commit failed
        consumer._abandon(msg, e)
        return
    consumer.processed += 1

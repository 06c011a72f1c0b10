"""The claim-aware receive protocol: one copy of each message in each of two regions, one claim
log, and each message handled once and in its session's order.

For each message the consumer received (``Consumer(..., claims=log)``)::

    read the entry (unknown and in a session: register it there first; the sender normally did)
      completed -> complete our copy, the handler is not called
      failed    -> dead-letter our copy (another region found it poison)
    an earlier message of the session not finished -> abandon, look again later (the order rule)
    granularity "session": claim the session; held live elsewhere -> abandon, look again later
    claim the message (create -> 409 -> pending: take with CAS; working, lease expired: take over)
      lost: working elsewhere, lease live -> abandon until that lease ends; finished -> as above
    run the handler, renewing the claim's lease (and the session's) in the background
      ok        -> claim completed, then our copy completed
      permanent -> claim failed, our copy dead-lettered
      other     -> claim released (pending: any region may retry it), our copy abandoned
      deferred  -> claim released, our copy deferred (DeferMessage raised or returned)

Nothing runs without a claim: a claim log that cannot be reached abandons the message with the
consumer's backoff. The claim is completed before the queue copy, and that completion is retried
while the lease lasts, so a claim log outage right after the handler does not run it again.

What can still run twice: a handler that outlives its lease without renewing it (the consumer
was frozen or cut off from the claim log for longer than ``claim_lease``) is taken over by the
other region. So effects are exactly once outside that window, and the window is the lease.

The order rule: positions come from ``ClaimLog.register`` (the ``GeoReplicatedTransport`` with
``claims`` registers before it sends), and a message starts only when every earlier registered
message of its session is completed or failed. That closes the case of per-message claims where
region B starts message 2 while region A still runs message 1 (B's copy of 1 dead-lettered after
repeated "working elsewhere", or never delivered).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dispatcher.claims.ports import ClaimEntry, ClaimLog, ClaimStatus, message_key, session_key
from dispatcher.queue.messages import DeferMessage
from dispatcher.queue.renewal import LeaseRenewer, Renewal
from outbox.core.clock import Clock
from outbox.core.errors import ClaimLogError, ClaimLostError, ConfigurationError

if TYPE_CHECKING:
    from dispatcher.queue.messages import ReceivedMessage
    from dispatcher.queue.sql_queue import SqlQueue

log = logging.getLogger("outbox.queue.claims")


class Granularity(StrEnum):
    """What a region claims before it runs a message. A ``StrEnum``: "message" and "session"
    work wherever a ``Granularity`` is asked for."""

    MESSAGE = "message"  # each message: the regions keep in step message by message
    SESSION = "session"  # also its session: a session stays in one region while it is held


#: The dead-letter reason of a copy whose message another region dead-lettered.
FAILED_ELSEWHERE = "ClaimFailedElsewhere"


class Consumer(Protocol):
    """What the protocol uses of ``consumer.Consumer`` (a Protocol: the consumer imports this
    module, so this module must not import it back)."""

    queue: SqlQueue
    handler: Any
    permanent_errors: tuple[type[BaseException], ...]
    processed: int
    backoff: Callable[[int], float]

    def _abandon(self, msg: ReceivedMessage, error: Exception) -> None: ...

    def _dead_letter(self, msg: ReceivedMessage, error: BaseException) -> None: ...

    def _defer(self, msg: ReceivedMessage, outcome: DeferMessage) -> None: ...

    def _settle(self, action: Any, msg: ReceivedMessage) -> None: ...


def default_owner() -> str:
    """Unique per consumer instance: a restarted process never mistakes an old claim for its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ClaimedReceive:
    """The protocol above for one ``Consumer``; its counters say what happened."""

    def __init__(
        self,
        claims: ClaimLog,
        queue_name: str,
        clock: Clock,
        *,
        granularity: Granularity | str = Granularity.MESSAGE,
        lease: float = 30.0,
        owner: str | None = None,
        look_again: float = 1.0,
        renew_check_interval: float = 1.0,
    ) -> None:
        try:
            self.granularity = Granularity(granularity)
        except ValueError:
            raise ConfigurationError(
                f"claim granularity {granularity!r} is not known",
                hint="use granularity='message' (each message claimed) or 'session'",
            ) from None
        if lease <= 0:
            raise ConfigurationError(f"claim_lease must be positive, got {lease!r}")
        self.claims = claims
        self.queue_name = queue_name
        self.clock = clock
        self.lease = timedelta(seconds=lease)
        self.owner = owner or default_owner()
        self.look_again = look_again
        self.renew_check_interval = renew_check_interval
        #: claim key -> lease end, renewed in the background while the handler runs
        self._held: LeaseRenewer[str] = LeaseRenewer(
            self._renew,
            clock,
            self.lease,
            name="outbox-claim-renewer",
            check_interval=renew_check_interval,
        )
        self.handled = 0  # handler calls that completed
        self.duplicates = 0  # copies completed without calling the handler
        self.deferred = 0  # copies abandoned to look again later (held elsewhere, or blocked)
        self.taken_over = 0  # claims won after an earlier attempt (expired lease, or released)

    # --- one message --------------------------------------------------------------------------

    def process(self, consumer: Consumer, msg: ReceivedMessage) -> None:
        now = self.clock.now()
        key = message_key(self.queue_name, msg.message_id)
        session = session_key(self.queue_name, msg.session_id) if msg.session_id else None
        try:
            entry = self._read(key, session, now)
            if entry is not None and entry.status.finished:
                self._settle_finished(consumer, msg, entry)
                return
            if session is not None and entry is not None and entry.position is not None:
                blocker = self.claims.blocker(session, entry.position)
                if blocker is not None:
                    self._later(consumer, msg, blocker, "an earlier message is unfinished:")
                    return
            # the session only after the order check: a region waiting for an earlier message
            # it does not hold must not keep the session from the region that holds it
            held = [key]
            if self.granularity is Granularity.SESSION and session is not None:
                got = self.claims.claim(session, self.owner, lease=self.lease, at=now)
                if not got.won:
                    self._later(consumer, msg, got.entry, "its session is held by")
                    return
                held.append(session)
            taken = self.claims.claim(key, self.owner, lease=self.lease, at=now, session=session)
        except ClaimLogError as e:  # nothing is handled without a claim
            delay = consumer.backoff(msg.delivery_count)
            log.warning("message %s waits %.1fs for the claim log: %s", msg.message_id, delay, e)
            consumer._settle(lambda m: consumer.queue.abandon(m, delay=delay), msg)
            return
        if not taken.won:
            if taken.entry.status.finished:
                self._settle_finished(consumer, msg, taken.entry)
            else:
                self._later(consumer, msg, taken.entry, "it is being handled by")
            return
        if taken.entry.attempts > 1 and taken.entry.owner == self.owner:
            self.taken_over += 1
        self._run(consumer, msg, key, held, now)

    def _read(self, key: str, session: str | None, now: datetime) -> ClaimEntry | None:
        """The entry, registered first when the sender did not (a read before a write: the
        sender normally registered it)."""
        entry = self.claims.read(key)
        if entry is None and session is not None:
            self.claims.register(session, [key], at=now)
            entry = self.claims.read(key)
        return entry

    def _run(
        self, consumer: Consumer, msg: ReceivedMessage, key: str, held: list[str], now: datetime
    ) -> None:
        for k in held:
            self._held.hold(k, now + self.lease)
        try:
            try:
                result = consumer.handler(msg)
            except DeferMessage as e:  # "not now": nobody holds it meanwhile
                self._settle_claim("release", key)
                consumer._defer(msg, e)
                return
            except consumer.permanent_errors as e:
                self._settle_claim("fail", key)
                consumer._dead_letter(msg, e)
                return
            except Exception as e:
                self._settle_claim("release", key)
                consumer._abandon(msg, e)
                return
            if isinstance(result, DeferMessage):
                self._settle_claim("release", key)
                consumer._defer(msg, result)
                return
            if self._complete(key):
                consumer._settle(consumer.queue.complete, msg)
                consumer.processed += 1
                self.handled += 1
            else:
                consumer._abandon(msg, ClaimLogError(f"claim {key!r} could not be completed"))
        finally:
            for k in held:  # a session claim is not renewed any more: it ends by itself
                self._held.forget(k)

    def _complete(self, key: str) -> bool:
        """Complete the claim, retrying while our lease lasts. True when the queue copy may be
        completed: the claim is completed, or another region took it over (it settles it)."""
        delay = 0.05
        while True:
            try:
                self.claims.complete(key, self.owner, at=self.clock.now())
                return True
            except ClaimLostError as e:
                log.warning("%s; the other region completes it (the effect may be repeated)", e)
                return True
            except ClaimLogError as e:
                until = self._held.end(key)
                left = 0.0 if until is None else (until - self.clock.now()).total_seconds()
                if not e.retryable or left <= 0:
                    log.warning(
                        "claim %s not completed: %s; the message will be redelivered", key, e
                    )
                    return False
                self.clock.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)

    def _settle_claim(self, action: Literal["fail", "release"], key: str) -> None:
        try:
            getattr(self.claims, action)(key, self.owner, at=self.clock.now())
        except ClaimLogError as e:  # the lease ends by itself; another region may retry then
            log.warning("could not %s claim %s: %s", action, key, e)

    def _settle_finished(self, consumer: Consumer, msg: ReceivedMessage, entry: ClaimEntry) -> None:
        self.duplicates += 1
        if entry.status is ClaimStatus.COMPLETED:
            log.debug(
                "message %s was handled already (%s); completing this copy",
                msg.message_id,
                entry.owner,
            )
            consumer._settle(consumer.queue.complete, msg)
        else:
            consumer._settle(
                lambda m: consumer.queue.dead_letter(
                    m, FAILED_ELSEWHERE, f"dead-lettered by {entry.owner}"
                ),
                msg,
            )

    def _later(self, consumer: Consumer, msg: ReceivedMessage, entry: ClaimEntry, why: str) -> None:
        """Abandon our copy until the other holder's lease ends (or ``look_again`` seconds)."""
        now = self.clock.now()
        delay = self.look_again
        if entry.live(now) and entry.lease_until is not None:
            delay = min(
                max((entry.lease_until - now).total_seconds(), self.look_again),
                self.lease.total_seconds(),
            )
        log.debug("message %s waits %.1fs: %s %s", msg.message_id, delay, why, entry.key)
        self.deferred += 1
        consumer._settle(lambda m: consumer.queue.abandon(m, delay=delay), msg)

    # --- lease renewal ------------------------------------------------------------------------

    def renewing(self) -> AbstractContextManager[None]:
        """Renew the held claims in the background (halfway through each lease, by the clock)."""
        return self._held.renewing()

    def _renew(self, key: str, now: datetime) -> datetime | Renewal:
        try:
            entry = self.claims.renew(key, self.owner, lease=self.lease, at=now)
        except ClaimLostError as e:
            log.warning("%s", e)
            return Renewal.LOST
        except ClaimLogError as e:  # retried next tick, while the lease lasts
            log.warning("could not renew claim %s: %s", key, e)
            return Renewal.LATER
        return Renewal.LATER if entry.lease_until is None else entry.lease_until

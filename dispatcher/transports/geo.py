"""Active/active across two regions: every message goes to both, the secondary copy later.

``GeoReplicatedTransport(primary, secondary, secondary_delay="15s")`` sends each batch to both
transports with the same ``message_id`` and ``session_id``; the secondary copy is scheduled
``secondary_delay`` after the primary's (``scheduled_at``, which the SQL queue honours as
``not_before`` and Service Bus as ``scheduled_enqueue_time_utc``), so the primary region normally
handles a message and the secondary's consumer finds it completed in the claim log.

When a send counts as settled (the point is send availability):

* both regions took the batch: settled;
* one took it, the other failed: **settled** - every message is held by at least one region. The
  miss is logged and counted (``missed``), and the region that failed is skipped for
  ``region_backoff`` seconds so a region that is down (a connect timeout per send) does not slow
  the outbox down; it is tried again after that, and at once when the only region tried fails.
  The messages it missed are not re-sent to it: the other region's consumer handles them (its
  copy is only ``secondary_delay`` late);
* both failed: the send raises (``PermanentTransportError`` when both refused the messages
  themselves, else ``RetryableTransportError``) and the outbox's normal retry and rescue re-send
  the batch later, with the same ids, to both.

Order across regions (``claims``): with a claim log, each session's message keys are registered
in batch order *before* anything is sent (``ClaimLog.register``), so consumers in either region
know each message's place and never start one before its predecessor finished
(``dispatcher.queue.claimed``). If the claim log cannot be reached the send fails retryably:
nothing is sent that consumers could not order. Messages both regions refused are marked failed
in the log, so they hold up nothing behind them.

The send is on the caller's path (immediate dispatch runs right after a commit), so it never waits
on the claim log longer than ``claim_log_timeout`` (default 1 s, else the outbox's
``claim_log_timeout`` setting): its calls go through ``claims.bounded(claim_log_timeout)``
(``dispatcher.claims.ports.BoundedClaimLog``), and the first one that gives up fails the send
retryably. The commit is durable already; the outbox's retry command or the rescuer sends later.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from dispatcher.claims.ports import BoundedClaimLog, ClaimLog, message_key, session_key
from dispatcher.transports.base import Transport, TransportMessage
from outbox.core.clock import Clock, SystemClock
from outbox.core.durations import parse_duration
from outbox.core.errors import (
    ClaimLogError,
    ClaimLostError,
    ClosedError,
    ConfigurationError,
    OutboxError,
    PermanentTransportError,
    RetryableTransportError,
    TransportError,
    TransportUnavailableError,
)

if TYPE_CHECKING:
    from outbox.core.settings import Settings

log = logging.getLogger("outbox.transports.geo")

#: Seconds a region that failed a send is skipped before it is tried again.
DEFAULT_REGION_BACKOFF = 30.0
#: Seconds a send may wait on the claim log (the ``claim_log_timeout`` setting's default).
DEFAULT_CLAIM_LOG_TIMEOUT = 1.0


class GeoReplicatedTransport:
    """A ``Transport`` over two regions' transports (any two: SQL queue, Service Bus...)."""

    #: a batch that both regions refuse is refused whole; one region's copy is atomic as its
    #: transport is, and the other region may miss it (settled on one region, see the module)
    atomic_batches = False

    def __init__(
        self,
        primary: Transport,
        secondary: Transport,
        secondary_delay: str | float = "15s",
        *,
        claims: ClaimLog | None = None,
        clock: Clock | None = None,
        region_backoff: str | float = DEFAULT_REGION_BACKOFF,
        names: tuple[str, str] = ("primary", "secondary"),
        claim_log_timeout: str | float | None = None,
    ) -> None:
        """``claim_log_timeout``: how long a send may wait on ``claims`` (default: the outbox's
        ``claim_log_timeout`` setting when ``Outbox.open`` wires this transport, else 1 s)."""
        self.regions = (primary, secondary)
        self.names = names
        self.secondary_delay = timedelta(
            seconds=parse_duration(secondary_delay, name="secondary_delay")
        )
        self.region_backoff = parse_duration(region_backoff, name="region_backoff")
        self.claims = claims
        self._timeout_given = claim_log_timeout is not None
        self.claim_log_timeout = self._positive_timeout(
            DEFAULT_CLAIM_LOG_TIMEOUT if claim_log_timeout is None else claim_log_timeout
        )
        self._send_claims: ClaimLog | None = None  # claims, bounded: made on first use
        self.clock = clock or SystemClock()
        self._owner = f"geo-sender-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._down_until: list[datetime | None] = [None, None]
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="outbox-geo-send")
        self._closed = False
        #: messages each region missed while the other settled them
        self.missed = [0, 0]

    @staticmethod
    def _positive_timeout(value: str | float) -> float:
        seconds = parse_duration(value, name="claim_log_timeout")
        if seconds <= 0:
            raise ConfigurationError(
                f"claim_log_timeout must be positive, got {value!r}", hint="e.g. 1s or 500ms"
            )
        return seconds

    def adopt_settings(self, settings: Settings) -> None:
        """Take ``claim_log_timeout`` from the outbox's settings unless it was given here
        (``DispatcherRuntime`` calls this for a transport passed to ``Outbox.open``)."""
        if self._timeout_given:
            return
        with self._lock:
            self.claim_log_timeout = self._positive_timeout(settings.claim_log_timeout)
            view, self._send_claims = self._send_claims, None
        if view is not None and view is not self.claims:
            view.close()

    # --- sending ------------------------------------------------------------------------------

    def send(self, batch: Sequence[TransportMessage]) -> None:
        batch = list(batch)
        if not batch:
            return
        if self._closed:
            raise ClosedError("the geo-replicated transport is closed", hint="build a new one")
        now = self.clock.now()
        if self.claims is not None:
            self._register(batch, now)
        copies = (batch, [self._delayed(m, now) for m in batch])
        targets = self._targets(now)
        errors = self._send_to(targets, copies)
        skipped = [i for i in (0, 1) if i not in targets]
        if len(errors) == len(targets) and skipped:  # the only region tried failed: try the other
            targets = [0, 1]
            errors.update(self._send_to(skipped, copies))
        ok = [i for i in targets if i not in errors]
        for i, err in errors.items():
            if isinstance(err, PermanentTransportError):  # the messages, not the region
                log.error("region %s refused a message: %s", self.names[i], err)
            else:
                self._mark_down(i, now, err)
        if ok:
            for i in (0, 1):
                if i not in ok:
                    with self._lock:
                        self.missed[i] += len(batch)
            for i in ok:
                self._mark_up(i)
            return
        self._refused(batch, errors, now)

    def _send_to(
        self, regions: list[int], copies: tuple[list[TransportMessage], list[TransportMessage]]
    ) -> dict[int, Exception]:
        """Send each region its copy, in parallel; the regions that failed, with their error."""
        futures = {i: self._pool.submit(self.regions[i].send, copies[i]) for i in regions}
        errors: dict[int, Exception] = {}
        for i, future in futures.items():
            try:
                future.result()
            except Exception as e:  # a region's own failure: judged by the caller
                errors[i] = e
        return errors

    def _delayed(self, m: TransportMessage, now: datetime) -> TransportMessage:
        base = m.scheduled_at if m.scheduled_at is not None and m.scheduled_at > now else now
        return replace(m, scheduled_at=base + self.secondary_delay)

    def _targets(self, now: datetime) -> list[int]:
        """The regions to send to: both, less one skipped since it failed (never both)."""
        with self._lock:
            up = [i for i in (0, 1) if not self._skipped(self._down_until[i], now)]
        return up or [0, 1]

    @staticmethod
    def _skipped(until: datetime | None, now: datetime) -> bool:
        return until is not None and until > now

    def _mark_down(self, i: int, now: datetime, error: Exception) -> None:
        log.warning(
            "region %s did not take a send (skipped for %.0fs): %s",
            self.names[i],
            self.region_backoff,
            error,
        )
        with self._lock:
            self._down_until[i] = now + timedelta(seconds=self.region_backoff)

    def _mark_up(self, i: int) -> None:
        with self._lock:
            self._down_until[i] = None

    def _refused(
        self, batch: list[TransportMessage], errors: dict[int, Exception], now: datetime
    ) -> None:
        """Both regions failed: raise, permanent only when both refused the messages."""
        first = errors.get(0) or errors[1]
        permanent = all(isinstance(e, PermanentTransportError) for e in errors.values())
        named = first.message_id if isinstance(first, TransportError) else None
        message_id = named or batch[0].message_id
        detail = "; ".join(f"{self.names[i]}: {e}" for i, e in sorted(errors.items()))
        if permanent:
            named_by = {e.message_id for e in errors.values() if isinstance(e, TransportError)}
            if len(named_by) == 1 and named:
                self._fail_registered([m for m in batch if m.message_id == named], now)
            raise PermanentTransportError(
                f"both regions refused message {message_id}: {detail}", message_id=message_id
            ) from first
        unanswered = all(isinstance(e, TransportUnavailableError) for e in errors.values())
        cls = TransportUnavailableError if unanswered else RetryableTransportError
        raise cls(
            f"no region took the batch with message {message_id}: {detail}",
            message_id=message_id,
        ) from first

    # --- the claim log ------------------------------------------------------------------------

    def _claims_for_sends(self) -> ClaimLog:
        """``claims`` bounded to ``claim_log_timeout`` (as it is when it cannot be bounded)."""
        assert self.claims is not None
        with self._lock:
            if self._send_claims is None:
                claims = self.claims
                self._send_claims = (
                    claims.bounded(self.claim_log_timeout)
                    if isinstance(claims, BoundedClaimLog)
                    else claims
                )
            return self._send_claims

    def _register(self, batch: list[TransportMessage], now: datetime) -> None:
        claims = self._claims_for_sends()
        sessions: dict[str, list[str]] = {}
        for m in batch:
            if m.session_id is not None:
                key = session_key(m.destination, m.session_id)
                sessions.setdefault(key, []).append(message_key(m.destination, m.message_id))
        try:
            for session, keys in sessions.items():
                claims.register(session, keys, at=now)
        except OutboxError as e:
            bound = (
                f" (waiting at most claim_log_timeout {self.claim_log_timeout:g}s)"
                if claims is not self.claims
                else ""
            )
            raise TransportUnavailableError(  # no send can go until it answers
                f"the claim log did not register message {batch[0].message_id}{bound}, so "
                f"nothing was sent and the send is retried later: {e}",
                message_id=batch[0].message_id,
            ) from e

    def _fail_registered(self, batch: list[TransportMessage], now: datetime) -> None:
        """A registered message both regions refused for good must not hold up its session. Only
        the message they named: the rest of a refused batch is re-sent one by one and delivered."""
        if self.claims is None:
            return
        claims = self._claims_for_sends()
        lease = timedelta(seconds=60)
        for m in batch:
            if m.session_id is None:
                continue
            key = message_key(m.destination, m.message_id)
            try:
                if claims.claim(key, self._owner, lease=lease, at=now).won:
                    claims.fail(key, self._owner, at=now)
            except (ClaimLostError, ClaimLogError) as e:
                log.warning("could not mark refused message %s failed: %s", m.message_id, e)

    def close(self) -> None:
        """The regions' transports and ``claims`` belong to whoever built them; the send pool and
        the bounded view of ``claims`` are ours."""
        self._closed = True
        self._pool.shutdown(wait=True)
        with self._lock:
            view, self._send_claims = self._send_claims, None
        if view is not None and view is not self.claims:
            view.close()

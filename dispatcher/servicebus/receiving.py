"""Receiving and settling on the Service Bus command queue, through one session receiver per
message (docs/servicebus.md, "Service Bus as the command queue"; ``command_queue`` sums it up).

Why receiving and settling together: the delivery-count limit is enforced on both sides (a copy
that carries its deliveries is dead-lettered on receive, an abandon or defer at the limit
dead-letters), and the delayed retry is a send, a renewal and a completion in one settlement.
The held messages themselves (lock token -> session receiver) are ``held``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from dispatcher.queue import validation
from dispatcher.queue.messages import PeekedMessage, QueueMessage, ReceivedMessage
from dispatcher.servicebus.commands import (
    MAX_DELIVERY_REASON,
    PROP_ORIGINAL_ID,
    PROP_PRIOR_DELIVERIES,
    derived_id,
)
from dispatcher.servicebus.held import HeldMessage, HeldMessages
from dispatcher.servicebus.sending import CommandSending
from outbox.core.clock import utc
from outbox.core.errors import LockLostError, MessageNotFoundError, ValidationError

if TYPE_CHECKING:
    from dispatcher.servicebus.options import ServiceBusQueueOptions


class CommandReceiving(CommandSending):
    """``QueueReceiver`` (with ``defer``) on a session-enabled Service Bus queue: each held
    message has its own lock, so settlements of different messages run in parallel."""

    def __init__(self, client: Any, options: ServiceBusQueueOptions) -> None:
        super().__init__(client, options)
        self._lock_duration = timedelta(seconds=options.lock_duration)
        self._max_delivery_count = options.max_delivery_count
        self._held = HeldMessages(self._errors)

    @property
    def lock_duration(self) -> timedelta:
        return self._lock_duration

    @property
    def max_delivery_count(self) -> int:
        return self._max_delivery_count

    # --- receiving ------------------------------------------------------------------------------

    def receive(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        """Lock up to ``max_messages`` sessions (one message each), or the head of one session."""
        self._check_open()
        out: list[ReceivedMessage] = []
        while len(out) < max_messages:
            got = self._receive_one(queue, session_id)
            if got is None:
                break
            out.append(got)
            if session_id is not None:
                break
        return out

    def _open_receiver(self, queue: str, session: Any) -> Any:
        with self._lock:
            return self._client.get_queue_receiver(
                queue_name=queue, session_id=session, max_wait_time=self.max_wait_time
            )

    def _receive_one(self, queue: str, session_id: str | None) -> ReceivedMessage | None:
        while True:
            receiver = self._open_receiver(queue, session_id or self._sb.NEXT_AVAILABLE_SESSION)
            try:
                got = receiver.receive_messages(
                    max_message_count=1, max_wait_time=self.max_wait_time
                )
            except (
                self._errors.OperationTimeoutError,
                self._errors.SessionCannotBeLockedError,
            ):
                receiver.close()  # no session available (or the named one is held elsewhere)
                return None
            except Exception as e:
                with contextlib.suppress(Exception):
                    receiver.close()
                raise self.unavailable(f"cannot receive from Service Bus queue {queue!r}", e) from e
            if not got:
                receiver.close()
                return None
            held = self._held.hold(queue, receiver, got[0])
            if self._within_limit(held):
                return held.received
            # dead-lettered past the limit: look for the next one

    def _within_limit(self, held: HeldMessage) -> bool:
        """True when ``held`` may be handed out. A copy that carries its deliveries can go past
        the limit: it is dead-lettered, as the broker would have done had it stayed one
        message."""
        if held.received.delivery_count <= self.max_delivery_count:
            return True
        with contextlib.suppress(LockLostError):
            self.dead_letter(
                held.received,
                MAX_DELIVERY_REASON,
                f"delivered {held.received.delivery_count - 1} times",
            )
        return False

    def receive_and_delete(
        self, queue: str, max_messages: int = 1, *, session_id: str | None = None
    ) -> list[ReceivedMessage]:
        raise ValidationError(
            "the Service Bus command queue does not receive-and-delete: commands must not be lost",
            hint="use receive() and settle",
        )

    def receive_deferred(
        self,
        queue: str,
        sequence_numbers: int | Sequence[int],
        *,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Each deferred message through a receiver of its session (the session this instance
        deferred it from, or ``session_id``); one message per session, as each received message
        holds its session's lock until it is settled."""
        self._check_open()
        validation.queue_name(queue)
        validation.identifier("session_id", session_id, optional=True)
        wanted = [sequence_numbers] if isinstance(sequence_numbers, int) else sequence_numbers
        seqs = sorted({validation.positive("sequence number", n) for n in wanted})
        sessions = self._held.deferred_sessions(queue, seqs, session_id)
        if len(set(sessions.values())) != len(sessions):
            raise ValidationError(
                "receive_deferred on Service Bus takes one deferred message per session at a "
                "time (a received message holds its session until it is settled)",
                hint="settle it, then receive the next one of that session",
            )
        out: list[ReceivedMessage] = []
        try:
            for n in seqs:
                got = self._receive_deferred_one(queue, n, sessions[n])
                if got is not None:
                    out.append(got)
        except Exception:
            for m in out:  # all or nothing, as on the SQL queue: release what was taken
                with contextlib.suppress(Exception):
                    self._held.find(m, take=True).receiver.close()
            raise
        return out

    def _receive_deferred_one(self, queue: str, n: int, session: str) -> ReceivedMessage | None:
        receiver = self._open_receiver(queue, session)
        try:
            [m] = receiver.receive_deferred_messages([n])
        except (self._errors.MessageNotFoundError, self._errors.SessionCannotBeLockedError) as e:
            receiver.close()
            raise MessageNotFoundError(
                f"queue {queue}: no deferred message with sequence number {n} is free to receive "
                f"({type(e).__name__})",
                hint="it was settled, is not deferred, or another receiver holds its session",
            ) from e
        except Exception as e:
            with contextlib.suppress(Exception):
                receiver.close()
            raise self.unavailable(f"cannot receive deferred message {n} from {queue!r}", e) from e
        held = self._held.hold(queue, receiver, m)
        held.deferred = True
        return held.received if self._within_limit(held) else None

    def peek(self, queue: str, limit: int = 10, *, deferred: bool = False) -> list[PeekedMessage]:
        raise ValidationError(
            "Service Bus cannot peek a session-enabled queue across sessions",
            hint="use `outbox status` for its depths",
        )

    # --- settling -------------------------------------------------------------------------------

    def complete(self, target: ReceivedMessage | str) -> None:
        held = self._held.find(target, take=True)
        self._held.settle(
            held, "complete", lambda: held.receiver.complete_message(held.sdk_message)
        )
        self._held.forget_deferred(held)

    def dead_letter(
        self, target: ReceivedMessage | str, reason: str, description: str = ""
    ) -> None:
        held = self._held.find(target, take=True)
        self._held.settle(
            held,
            "dead_letter",
            lambda: held.receiver.dead_letter_message(
                held.sdk_message, reason=reason, error_description=description
            ),
        )
        self._held.forget_deferred(held)

    def _dead_letter_at_limit(
        self, held: HeldMessage, target: ReceivedMessage | str, how: str
    ) -> bool:
        """At ``max_delivery_count`` deliveries an abandon or a defer dead-letters instead (a
        defer counts like an abandon, and a copy's deliveries are ours to count)."""
        count = held.received.delivery_count
        if count < self.max_delivery_count:
            return False
        self._held.put_back(held)
        self.dead_letter(target, MAX_DELIVERY_REASON, f"{how} after {count} deliveries")
        return True

    def abandon(self, target: ReceivedMessage | str, delay: float = 0) -> None:
        """Release for another delivery, after ``delay`` seconds (a scheduled copy, see
        ``command_queue``). At ``max_delivery_count`` deliveries it is dead-lettered instead."""
        held = self._held.find(target, take=True)
        if self._dead_letter_at_limit(held, target, "abandoned"):
            return
        if delay <= 0 or held.deferred:  # a deferred message stays deferred: no copy, no delay
            self._held.settle(
                held, "abandon", lambda: held.receiver.abandon_message(held.sdk_message)
            )
            return
        self._held.settle(held, "abandon", lambda: self._retry_later(held, delay))

    def _retry_later(self, held: HeldMessage, delay: float) -> None:
        r, m = held.received, held.sdk_message
        held.receiver.session.renew_lock()  # raises SessionLockLostError if it is not ours
        copy = QueueMessage(
            body=r.body,
            message_id=derived_id(r.message_id, str(r.delivery_count)),
            session_id=r.session_id,
            not_before=utc(self.clock.now()) + timedelta(seconds=delay),
            subject=r.subject,
            content_type=r.content_type,
            correlation_id=r.correlation_id,
            headers=dict(r.headers),
        )
        extra = {PROP_ORIGINAL_ID: r.message_id, PROP_PRIOR_DELIVERIES: str(r.delivery_count)}
        sdk_copy = self._to_sdk(copy, extra=extra)
        if r.session_id is None:  # the copy stays in the original's own session
            sdk_copy.session_id = m.session_id
        self._send_sdk(r.queue, [sdk_copy])
        held.receiver.complete_message(m)

    def defer(self, target: ReceivedMessage | str) -> None:
        """Set the message aside (``defer_message``): only ``receive_deferred`` brings it back."""
        held = self._held.find(target, take=True)
        if self._dead_letter_at_limit(held, target, "deferred"):
            return
        self._held.settle(held, "defer", lambda: held.receiver.defer_message(held.sdk_message))
        self._held.remember_deferred(held)

    def renew_lock(self, target: ReceivedMessage | str) -> datetime:
        return self._held.renew(target)

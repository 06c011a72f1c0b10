"""The messages the Service Bus command queue holds: each received message with the session
receiver that holds it, found by its lock token, and the session of each message it deferred.

Why a table: on Service Bus a message's lock is its session's lock, held by the session receiver
that received it, while the worker hands back only our ``ReceivedMessage`` (or its lock token).
Settling, renewing and closing all start by finding that receiver here. A settlement closes the
receiver, which releases the session; a renewal renews the session's lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any

from dispatcher.queue.messages import ReceivedMessage
from dispatcher.servicebus.commands import to_received
from dispatcher.servicebus.errors import unavailable
from outbox.core.clock import utc
from outbox.core.errors import LockLostError, MessageNotFoundError, ValidationError


@dataclass
class HeldMessage:
    """One received message: its SDK message, the session receiver that holds it, and ours."""

    receiver: Any
    sdk_message: Any
    received: ReceivedMessage
    original_id: str
    #: one SDK call at a time on this message (a settlement against its lock's renewal)
    lock: threading.Lock = field(default_factory=threading.Lock)
    deferred: bool = False  # received by receive_deferred: an abandon leaves it deferred


class HeldMessages:
    """The held messages by lock token, and the deferred messages' sessions by sequence number
    (the service receives a deferred message only through its session). Thread-safe."""

    def __init__(self, errors: ModuleType) -> None:
        self._errors = errors  # azure.servicebus.exceptions
        self._lock = threading.Lock()
        self._held: dict[str, HeldMessage] = {}
        self._deferred_sessions: dict[int, str] = {}

    def hold(self, queue: str, receiver: Any, m: Any) -> HeldMessage:
        """Keep ``m``, received by ``receiver``; its lock lasts as long as its session's."""
        locked_until = m.locked_until_utc
        if receiver.session is not None and receiver.session.locked_until_utc is not None:
            locked_until = receiver.session.locked_until_utc
        received = to_received(queue, m, locked_until)
        held = HeldMessage(receiver, m, received, received.message_id)
        self.put_back(held)
        return held

    def put_back(self, held: HeldMessage) -> None:
        with self._lock:
            self._held[held.received.lock_token or ""] = held

    def find(self, target: ReceivedMessage | str, *, take: bool) -> HeldMessage:
        """The held message ``target`` names (removed from the table when ``take``)."""
        token = target if isinstance(target, str) else target.lock_token
        mid = target if isinstance(target, str) else target.message_id
        if token is None:
            raise ValidationError(f"message {mid} has no lock: it was received and deleted")
        with self._lock:
            held = self._held.pop(token, None) if take else self._held.get(token)
        if held is None:
            raise LockLostError(
                f"message {mid}: no lock held with that token (settled already, or received "
                "elsewhere)"
            )
        return held

    def take_all(self) -> list[HeldMessage]:
        """Every held message, forgotten (the queue is closing)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        return held

    # --- settling and renewing --------------------------------------------------------------

    def lock_errors(self) -> tuple[type[BaseException], ...]:
        e = self._errors
        return (e.SessionLockLostError, e.MessageLockLostError, e.MessageAlreadySettled)

    def settle(self, held: HeldMessage, how: str, action: Callable[[], Any]) -> None:
        """Run ``action`` on ``held`` (taken from the table), then close its receiver, which
        releases the session whatever happened."""
        try:
            with held.lock:
                action()
        except self.lock_errors() as e:
            raise LockLostError(
                f"message {held.original_id}: lock lost before {how} ({type(e).__name__})"
            ) from e
        except Exception as e:
            raise unavailable(self._errors, f"message {held.original_id}: {how} failed", e) from e
        finally:
            with contextlib.suppress(Exception):
                held.receiver.close()  # releases the session

    def renew(self, target: ReceivedMessage | str) -> datetime:
        """Renew the lock of the session that holds ``target``; a lost one is forgotten."""
        held = self.find(target, take=False)
        try:
            with held.lock:
                until = held.receiver.session.renew_lock()
        except self.lock_errors() as e:
            with self._lock:
                self._held.pop(held.received.lock_token or "", None)
            raise LockLostError(
                f"message {held.original_id}: lock lost, cannot renew ({type(e).__name__})"
            ) from e
        except Exception as e:
            raise unavailable(self._errors, f"message {held.original_id}: renew failed", e) from e
        return utc(until)

    # --- deferred messages' sessions ----------------------------------------------------------

    def remember_deferred(self, held: HeldMessage) -> None:
        with self._lock:
            self._deferred_sessions[held.received.sequence_number] = str(
                held.sdk_message.session_id
            )

    def forget_deferred(self, held: HeldMessage) -> None:
        """A settled deferred message is gone: its session need not be remembered."""
        if held.deferred:
            with self._lock:
                self._deferred_sessions.pop(held.received.sequence_number, None)

    def deferred_sessions(
        self, queue: str, seqs: Sequence[int], session_id: str | None
    ) -> dict[int, str]:
        """The session of each deferred message: ``session_id``, or the one it was deferred
        from by this queue."""
        sessions: dict[int, str] = {}
        with self._lock:
            for n in seqs:
                sid = session_id or self._deferred_sessions.get(n)
                if sid is None:
                    raise MessageNotFoundError(
                        f"queue {queue}: this queue deferred no message with sequence number "
                        f"{n}, and Service Bus receives a deferred message only through its "
                        "session",
                        hint="pass session_id=... (a message sent without one is in the session "
                        "named by its message id)",
                    )
                sessions[n] = sid
        return sessions
